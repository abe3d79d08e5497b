/*
 * A model's last agent leaving without being lost: drained by an admin
 * (POST /admin/agents/{id}/drain), draining itself (a poll with status
 * "draining"), or removed by an admin (DELETE /admin/agents/{id}). Its
 * queued jobs with fallback_models move to their fallback at once, as
 * after a lost agent (docs/api.md "Failover and fallback"), instead of
 * waiting out queue_timeout; jobs without a fallback stay queued; a job
 * already running on the draining agent stays there and finishes.
 *
 * "Its model's last agent" is per job, as the scheduler routes it: for a
 * job with tools only agents taking tools for the model count, for one
 * with labels only agents with them, on the fallback side too.
 *
 * Real things throughout: the registry reports its transitions to
 * agents_api (which defers the move out of the registry's call), the admin
 * routes are called over HTTP on loopback, and the jobs are taken and fed
 * events through the jobs module's public functions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/gp_util.h"
#include "fixture_fleet.h"
#include "server/admin_api.h"
#include "server/agents_api.h"
#include "server/auth/auth.h"
#include "server/http/http.h"
#include "server/jobs/jobs.h"

typedef struct fixture {
    fleet fl;
    gps_agents *g;
    gps_auth *auth;
    gps_admin *admin;
    gps_http *http;
    int port;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    /* agents_api first: the registry reports transitions to it */
    struct event_base *base = event_base_new();
    assert_non_null(base);
    gps_agents_opts ao = {.poll_interval_sec = 15, .work_wait_sec = 25,
                          .agent_timeout_sec = 90, .disconnect_grace_ms = 1000};
    f->g = gps_agents_new(base, &ao, NULL, NULL);
    assert_non_null(f->g);
    registry_config rc;
    registry_config_default(&rc);
    rc.listener = gps_agents_on_transition;
    rc.listener_ud = f->g;
    /* queue_timeout 600 s: a job the move missed would still be queued */
    gps_jobs_opts jo = {.max_queue = 100, .queue_timeout_sec = 600, .request_timeout_sec = 600,
                        .stall_timeout_sec = 600, .max_attempts = 5, .poll_interval_sec = 15};
    fleet_init_on(&f->fl, base, &jo, &rc, NULL);
    assert_int_equal(gps_agents_attach(f->g, f->fl.reg, f->fl.s, f->fl.jobs), 0);
    f->auth = gps_auth_new(NULL);
    assert_non_null(f->auth);
    f->admin = gps_admin_new(base, f->auth, NULL, f->fl.reg, f->fl.jobs, NULL, "test");
    assert_non_null(f->admin);
    gps_http_opts ho = {.max_body_bytes = 1 << 20, .max_header_bytes = 1 << 16,
                        .idle_timeout_sec = 30, .max_inflight_body_bytes = 1 << 24,
                        .header_timeout_sec = 30, .body_timeout_sec = 30};
    f->http = gps_http_new(base, &ho);
    assert_non_null(f->http);
    char err[256] = "";
    assert_int_equal(gps_http_bind(f->http, "127.0.0.1", 0, &f->port, err, sizeof err), 0);
    assert_int_equal(gps_admin_register(f->http, f->admin), 0);
    /* the agents' own routes too: their polls go through h_poll */
    assert_int_equal(gps_agents_register(f->http, f->g), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    struct event_base *base = f->fl.base;
    gps_http_free(f->http);
    gps_admin_free(f->admin);
    gps_agents_free(f->g);
    fleet_free(&f->fl);
    gps_auth_free(f->auth);
    event_base_free(base);
    free(f);
    return 0;
}

/* A new loopback connection to the server with req sent on it. */
static int send_new(fixture *f, const char *req)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(send(c, req, strlen(req), 0), (ssize_t)strlen(req));
    return c;
}

/* One admin request on a new connection; the loop runs until its whole
 * reply came back, then once more for what the server deferred (the
 * moves run from a zero-delay event). Returns the HTTP status. */
static int admin(fixture *f, const char *method, const char *path, const char *json)
{
    char req[1024], out[16384];
    snprintf(req, sizeof req,
             "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
             method, path, json ? strlen(json) : 0, json ? json : "");
    int c = send_new(f, req);
    size_t got = 0;
    out[0] = '\0';
    for (int round = 0; round < 5000; round++) {
        event_base_loop(f->fl.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        ssize_t n = recv(c, out + got, sizeof out - 1 - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            out[got] = '\0';
        }
        const char *end = strstr(out, "\r\n\r\n"), *cl = strstr(out, "Content-Length: ");
        if (end && cl && got >= (size_t)(end + 4 - out) + strtoul(cl + 16, NULL, 10)) {
            close(c);
            event_base_loop(f->fl.base, EVLOOP_NONBLOCK);
            return atoi(out + 9);
        }
        if (n <= 0)
            usleep(1000);
    }
    fail_msg("no whole reply to %s %s: %s", method, path, out);
    return -1;
}

/* The registry alone takes the poll j (consumed): the agent it updated,
 * or NULL. No deferred work runs. */
static registry_agent *heartbeat(fixture *f, json_t *j)
{
    assert_non_null(j);
    registry_facts facts;
    char err[160];
    if (registry_facts_parse(j, &facts, err, sizeof err) != 0)
        fail_msg("%s", err);
    json_decref(j);
    registry_agent *a = registry_heartbeat(f->fl.reg, &facts, gp_now_mono_ms(), 0);
    registry_facts_free(&facts);
    return a;
}

/* Agent i polls over HTTP (POST /agents/poll, as an agent does) with
 * models, a JSON array text, two slots; the deferred moves run. */
static registry_agent *poll_labeled(fixture *f, int i, const char *models, const char *labels)
{
    char id[64], body[512];
    snprintf(id, sizeof id, "00000000-0000-4000-8000-%012x", (unsigned)i);
    snprintf(body, sizeof body,
             "{\"agent_id\":\"%s\",\"name\":\"a%d\",\"models\":%s,\"slots\":{\"total\":2},"
             "\"labels\":%s}",
             id, i, models, labels);
    assert_int_equal(admin(f, "POST", "/agents/poll", body), 200);
    registry_agent *a = registry_get(f->fl.reg, id);
    assert_non_null(a);
    return a;
}

static registry_agent *poll_models(fixture *f, int i, const char *models)
{
    return poll_labeled(f, i, models, "{}");
}

/* Agent i parks a long-poll for work with free_slots free, as an agent
 * does between jobs; the connection (returned) stays open, unanswered. */
static int park(fixture *f, int i, int free_slots)
{
    char body[160], req[512];
    snprintf(body, sizeof body,
             "{\"agent_id\":\"00000000-0000-4000-8000-%012x\",\"free_slots\":%d}",
             (unsigned)i, free_slots);
    snprintf(req, sizeof req,
             "POST /agents/work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    int c = send_new(f, req);
    for (int round = 0; round < 200; round++) {
        event_base_loop(f->fl.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        usleep(1000);
    }
    return c;
}

/* Agent i polls again serving model, online or draining (the agent's own
 * drain, docs/protocol.md); the registry's transition reaches agents_api,
 * whose deferred work the loop then runs. */
static void poll_status(fixture *f, int i, const char *model, bool draining)
{
    char id[64];
    snprintf(id, sizeof id, "00000000-0000-4000-8000-%012x", (unsigned)i);
    json_t *j = json_pack("{s:s, s:[{s:s}], s:{s:i}, s:s}", "agent_id", id, "models", "id",
                          model, "slots", "total", 2, "status",
                          draining ? "draining" : "online");
    assert_non_null(heartbeat(f, j));
    event_base_loop(f->fl.base, EVLOOP_NONBLOCK);
}

/* A job's spec for model, with fallback (NULL: none). */
static gps_job_spec spec_for(const char *model, const char *fallback)
{
    gps_job_spec s = fleet_spec(model, 20);
    if (fallback) {
        s.fallback_models[0] = strdup(fallback);
        s.n_fallback = 1;
    }
    return s;
}

/* The job of s carries tools: only an agent taking tools for its model
 * runs it. */
static void with_tools(gps_job_spec *s)
{
    s->tools = json_pack("[{s:s}]", "type", "function");
    assert_non_null(s->tools);
}

/* A job for model, with fallback (NULL: none), queued: no agent is ready. */
static gps_job *queued(fixture *f, const char *model, const char *fallback)
{
    gps_job_spec s = spec_for(model, fallback);
    gps_job *job = fleet_submit(&f->fl, &s);
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_string_equal(job->spec.model, model);
    return job;
}

/* Agent ag takes exactly job, as model. */
static void taken_by(fixture *f, registry_agent *ag, gps_job *job, const char *model)
{
    json_t *w = fleet_take(&f->fl, ag);
    assert_string_equal(json_string_value(json_object_get(w, "job_id")), job->id);
    assert_string_equal(json_string_value(json_object_get(w, "model")), model);
    json_decref(w);
    assert_int_equal(job->state, GPS_JOB_ASSIGNED);
    assert_string_equal(job->agent_id, ag->id);
}

static void finish(fixture *f, gps_job *job, registry_agent *ag)
{
    assert_int_equal(fleet_apply(&f->fl, job, ag, job->agent_seq,
                                 "[{\"type\":\"started\"},{\"type\":\"token\",\"text\":\"hi\"},"
                                 "{\"type\":\"end\",\"finish_reason\":\"stop\","
                                 "\"usage\":{\"completion_tokens\":1}}]"),
                     0);
    assert_int_equal(job->state, GPS_JOB_DONE);
}

/* Agent ag takes exactly job, as model, and finishes it. */
static void served_by(fixture *f, registry_agent *ag, gps_job *job, const char *model)
{
    taken_by(f, ag, job, model);
    finish(f, job, ag);
}

/* An admin drains agent ag (on), or undrains it. */
static void drain(fixture *f, registry_agent *ag, bool on)
{
    char path[128];
    snprintf(path, sizeof path, "/admin/agents/%s/drain", ag->id);
    assert_int_equal(admin(f, "POST", path, on ? NULL : "{\"on\":false}"), 200);
}

/* An admin removes agent ag (force: even while it is busy); it is gone. */
static void removed(fixture *f, registry_agent *ag, bool force)
{
    char id[64], path[128];
    snprintf(id, sizeof id, "%s", ag->id); /* ag is freed with it */
    snprintf(path, sizeof path, "/admin/agents/%s%s", id, force ? "?force=1" : "");
    assert_int_equal(admin(f, "DELETE", path, NULL), 200);
    assert_null(registry_get(f->fl.reg, id));
}

/* The job stays queued for A, as it was asked for: nothing moved it. */
static void stayed_with_a(const gps_job *job)
{
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_string_equal(job->spec.model, "A");
    assert_null(job->requested_model);
}

/* The running job failed over to B and the queued one moved there: both
 * wait in B's queue, and ag serves them, the failed-over one first. */
static void both_on_b(fixture *f, gps_job *running, gps_job *moved, registry_agent *ag)
{
    assert_int_equal(running->state, GPS_JOB_QUEUED);
    assert_string_equal(running->spec.model, "B");
    assert_int_equal(moved->state, GPS_JOB_QUEUED);
    assert_string_equal(moved->spec.model, "B");
    assert_string_equal(moved->requested_model, "A");
    assert_int_equal(sched_queue_depth(f->fl.s, "B", SCHED_INTERACTIVE), 2);
    served_by(f, ag, running, "B");
    served_by(f, ag, moved, "B");
}

/* The job moved to B as a failover to a fallback would: B serves it, A is
 * the model asked for (the dialects' x_pool_meta.model and warnings come
 * from these), and it waits in B's queue for B's agent. */
static void moved_to_b(fixture *f, gps_job *job)
{
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_string_equal(job->spec.model, "B");
    assert_string_equal(gps_job_model(job), "B");
    assert_non_null(job->requested_model);
    assert_string_equal(job->requested_model, "A");
    assert_true(sched_job_queued(&job->sj));
    assert_string_equal(job->sj.model, "B");
    assert_int_equal(sched_queue_depth(f->fl.s, "B", SCHED_INTERACTIVE), 1);
}

/* ------------------------------------------------------------------ */

/* A's only agent is drained by an admin while it runs one job of A and
 * two more wait: the one with fallback B moves to B and B's agent serves
 * it; the one without stays queued for A; the running one finishes on the
 * draining agent. Before, the queued job with a fallback waited out
 * queue_timeout in A's queue. */
static void test_admin_drain(void **state)
{
    fixture *f = *state;
    uint64_t now = gp_now_mono_ms();
    registry_agent *a = fleet_agent(&f->fl, 1, "A", NULL, 2, now);
    registry_agent *b = fleet_agent(&f->fl, 2, "B", NULL, 2, now);
    gps_job *running = queued(f, "A", "B");
    taken_by(f, a, running, "A");
    gps_job *moving = queued(f, "A", "B");
    gps_job *staying = queued(f, "A", NULL);

    drain(f, a, true);
    assert_int_equal(a->state, REGISTRY_DRAINING);

    moved_to_b(f, moving);
    served_by(f, b, moving, "B");
    /* no fallback: it waits for A (an undrain, another agent) */
    stayed_with_a(staying);
    /* a drain lets what runs finish where it runs */
    assert_int_equal(running->state, GPS_JOB_ASSIGNED);
    assert_string_equal(running->agent_id, a->id);
    assert_string_equal(running->spec.model, "A");
    finish(f, running, a);
    /* undrained, A's agent takes the job that waited for it */
    drain(f, a, false);
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    served_by(f, a, staying, "A");
}

/* The agent drains itself (its poll says status "draining"): the same. A
 * job whose only fallback has no live agent either stays queued for A
 * (it does not bounce between the two). */
static void test_agent_drains_itself(void **state)
{
    fixture *f = *state;
    uint64_t now = gp_now_mono_ms();
    registry_agent *a = fleet_agent(&f->fl, 1, "A", NULL, 2, now);
    registry_agent *b = fleet_agent(&f->fl, 2, "B", NULL, 2, now);
    gps_job *moving = queued(f, "A", "B");
    gps_job *nowhere = queued(f, "A", "C");
    poll_status(f, 1, "A", true);
    assert_int_equal(a->state, REGISTRY_DRAINING);
    moved_to_b(f, moving);
    assert_int_equal(nowhere->state, GPS_JOB_QUEUED);
    assert_string_equal(nowhere->spec.model, "A");
    assert_int_equal(sched_queue_depth(f->fl.s, "A", SCHED_INTERACTIVE), 1);
    served_by(f, b, moving, "B");
    gps_jobs_cancel(f->fl.jobs, nowhere, "test over");
}

/* A second agent of A still serving keeps A's jobs with A: draining one
 * of two moves nothing. */
static void test_drain_with_another_agent_left(void **state)
{
    fixture *f = *state;
    uint64_t now = gp_now_mono_ms();
    registry_agent *a1 = fleet_agent(&f->fl, 1, "A", NULL, 2, now);
    registry_agent *a2 = fleet_agent(&f->fl, 3, "A", NULL, 2, now);
    fleet_agent(&f->fl, 2, "B", NULL, 2, now);
    gps_job *job = queued(f, "A", "B");
    drain(f, a1, true);
    stayed_with_a(job);
    served_by(f, a2, job, "A");
}

/* An admin removes A's only agent (idle): its queued job with fallback B
 * moves to B at once; one without stays queued for A. */
static void test_admin_remove(void **state)
{
    fixture *f = *state;
    uint64_t now = gp_now_mono_ms();
    registry_agent *a = fleet_agent(&f->fl, 1, "A", NULL, 2, now);
    registry_agent *b = fleet_agent(&f->fl, 2, "B", NULL, 2, now);
    gps_job *moving = queued(f, "A", "B");
    gps_job *staying = queued(f, "A", NULL);
    removed(f, a, false);
    moved_to_b(f, moving);
    served_by(f, b, moving, "B");
    assert_int_equal(staying->state, GPS_JOB_QUEUED);
    assert_string_equal(staying->spec.model, "A");
    gps_jobs_cancel(f->fl.jobs, staying, "test over");
}

/* An agent that stays healthy stops listing A (an operator unloaded it,
 * its replica was scaled down): A's queued job with fallback B moves to B
 * at once and is served there, by that same agent (it still serves B);
 * one without a fallback stays queued for A; when the agent lists A again
 * it serves that one. Before, both waited out queue_timeout in A's queue. */
static void test_poll_drops_model(void **state)
{
    fixture *f = *state;
    registry_agent *a = poll_models(f, 1, "[{\"id\":\"A\"},{\"id\":\"B\"}]");
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    gps_job *moving = queued(f, "A", "B");
    gps_job *staying = queued(f, "A", NULL);
    /* a poll that changes nothing moves nothing */
    a = poll_models(f, 1, "[{\"id\":\"A\"},{\"id\":\"B\"}]");
    assert_string_equal(moving->spec.model, "A");
    assert_int_equal(sched_queue_depth(f->fl.s, "A", SCHED_INTERACTIVE), 2);

    a = poll_models(f, 1, "[{\"id\":\"B\"}]");
    assert_int_equal(a->state, REGISTRY_HEALTHY);
    moved_to_b(f, moving);
    assert_null(a->models_before); /* looked at once, then freed */
    served_by(f, a, moving, "B");
    stayed_with_a(staying);
    assert_int_equal(sched_queue_depth(f->fl.s, "A", SCHED_INTERACTIVE), 1);

    a = poll_models(f, 1, "[{\"id\":\"A\"},{\"id\":\"B\"}]");
    served_by(f, a, staying, "A");
}

/* An alias dropped counts as a name lost (jobs queue under the name they
 * asked for); a name another live agent still serves moves nothing. */
static void test_poll_drops_alias_and_shared_name(void **state)
{
    fixture *f = *state;
    uint64_t now = gp_now_mono_ms();
    registry_agent *a = poll_models(f, 1, "[{\"id\":\"A\",\"aliases\":[\"al\"]}]");
    registry_agent *other = fleet_agent(&f->fl, 3, "A", NULL, 2, now);
    registry_agent *b = fleet_agent(&f->fl, 2, "B", NULL, 2, now);
    gps_job *by_alias = queued(f, "al", "B");
    gps_job *by_id = queued(f, "A", "B");
    a = poll_models(f, 1, "[{\"id\":\"C\"}]");
    /* "al": nobody serves it now */
    assert_int_equal(by_alias->state, GPS_JOB_QUEUED);
    assert_string_equal(by_alias->spec.model, "B");
    assert_string_equal(by_alias->requested_model, "al");
    /* "A": the other agent still does */
    assert_string_equal(by_id->spec.model, "A");
    assert_null(by_id->requested_model);
    served_by(f, b, by_alias, "B");
    served_by(f, other, by_id, "A");
    (void)a;
}

/* Two heartbeats change agent 1's list before the deferred work runs
 * (A,B -> B,C -> C): what counts is what it lost since the list last
 * looked at, A and B both, and their jobs move to C, which it serves. */
static void test_two_changes_before_the_move(void **state)
{
    fixture *f = *state;
    registry_agent *a = poll_models(f, 1, "[{\"id\":\"A\"},{\"id\":\"B\"}]");
    gps_job *of_a = queued(f, "A", "C");
    gps_job *of_b = queued(f, "B", "C");
    const char *lists[] = {"[{\"id\":\"B\"},{\"id\":\"C\"}]", "[{\"id\":\"C\"}]"};
    for (int k = 0; k < 2; k++) { /* the registry alone: no deferred work */
        char body[256];
        snprintf(body, sizeof body, "{\"agent_id\":\"%s\",\"models\":%s,\"slots\":{\"total\":2}}",
                 a->id, lists[k]);
        assert_ptr_equal(heartbeat(f, json_loads(body, 0, NULL)), a);
    }
    assert_string_equal(of_a->spec.model, "A");
    assert_string_equal(of_b->spec.model, "B");
    /* its next poll (the list unchanged since) runs the move */
    a = poll_models(f, 1, lists[1]);
    assert_string_equal(of_a->spec.model, "C");
    assert_string_equal(of_b->spec.model, "C");
    assert_int_equal(sched_queue_depth(f->fl.s, "C", SCHED_INTERACTIVE), 2);
    served_by(f, a, of_a, "C");
    served_by(f, a, of_b, "C");
}

/* An admin force-removes a busy agent that serves A and, with tools, B,
 * while it is parked with a free slot. A job for A that needs tools waits
 * in A's queue (that agent's A takes no tools; the agent of A that does
 * went suspect), fallback B. The removal moves it to B: it must wait for
 * B's other agent, not be handed to the agent being removed (it would sit
 * assigned to an agent that no longer exists until a failover timeout). */
static void test_force_remove_parked(void **state)
{
    fixture *f = *state;
    registry_agent *x =
        poll_models(f, 1, "[{\"id\":\"A\"},{\"id\":\"B\",\"supports_tools\":true}]");
    registry_agent *y = poll_models(f, 2, "[{\"id\":\"B\",\"supports_tools\":true}]");
    registry_agent *z = poll_models(f, 3, "[{\"id\":\"A\",\"supports_tools\":true}]");
    gps_job *running = queued(f, "A", "B");
    taken_by(f, x, running, "A");
    gps_job_spec s = spec_for("A", "B");
    with_tools(&s);
    gps_job *tools = fleet_submit(&f->fl, &s);
    assert_int_equal(tools->state, GPS_JOB_QUEUED);
    assert_true(registry_mark_suspect(f->fl.reg, z, gp_now_mono_ms(), "test"));
    event_base_loop(f->fl.base, EVLOOP_NONBLOCK);
    int c = park(f, 1, 1);
    assert_true(sched_agent_is_ready(f->fl.s, x));
    assert_int_equal(tools->state, GPS_JOB_QUEUED);
    assert_string_equal(tools->spec.model, "A");

    removed(f, x, true);
    close(c);
    /* both wait for B's agent: the running one failed over, the queued one moved */
    assert_true(sched_job_queued(&tools->sj));
    both_on_b(f, running, tools, y);
}

/* ---- "still served" is the scheduler's: per job (tools) ---- */

/* A job for model with fallback B that carries tools: the scheduler gives
 * it only to an agent taking tools for its model. Queued: no agent ready. */
static gps_job *queued_tools(fixture *f, const char *model)
{
    gps_job_spec s = spec_for(model, "B");
    with_tools(&s);
    gps_job *job = fleet_submit(&f->fl, &s);
    assert_int_equal(job->state, GPS_JOB_QUEUED);
    assert_true(job->sj.needs_tools);
    assert_string_equal(job->spec.model, model);
    return job;
}

/* X (agent 1) serves A with tools, Y (2) A without, Z (3) B with tools,
 * over HTTP polls. */
static void three_agents(fixture *f, registry_agent **x, registry_agent **y, registry_agent **z)
{
    *x = poll_models(f, 1, "[{\"id\":\"A\",\"supports_tools\":true}]");
    *y = poll_models(f, 2, "[{\"id\":\"A\"}]");
    *z = poll_models(f, 3, "[{\"id\":\"B\",\"supports_tools\":true}]");
}

/* The tools (or labeled) job moved to B and Z runs it; the plain one stayed with A,
 * where Y runs it. */
static void tools_moved_plain_stayed(fixture *f, gps_job *tools, gps_job *plain,
                                     registry_agent *y, registry_agent *z)
{
    moved_to_b(f, tools);
    served_by(f, z, tools, "B");
    stayed_with_a(plain);
    served_by(f, y, plain, "A");
}

/* X, A's only agent taking tools, is drained by an admin while Y still
 * serves A without tools: the tools job for A can run nowhere under A and
 * moves to B (Z takes tools there); the plain job stays with A (Y). Before,
 * Y counted as "A is still served" for both: the tools job waited out
 * queue_timeout. */
static void test_drain_last_tools_agent(void **state)
{
    fixture *f = *state;
    registry_agent *x, *y, *z;
    three_agents(f, &x, &y, &z);
    gps_job *tools = queued_tools(f, "A");
    gps_job *plain = queued(f, "A", "B");
    drain(f, x, true);
    assert_int_equal(x->state, REGISTRY_DRAINING);
    tools_moved_plain_stayed(f, tools, plain, y, z);
}

/* X is lost (it deregisters over HTTP, as at a clean stop) while it runs a
 * tools job of A: the running one fails over to B (no agent left takes
 * tools for A) and the queued tools job moves too (move_stranded); the
 * plain job stays with A. */
static void test_lost_last_tools_agent(void **state)
{
    fixture *f = *state;
    registry_agent *x, *y, *z;
    three_agents(f, &x, &y, &z);
    gps_job *running = queued_tools(f, "A");
    taken_by(f, x, running, "A");
    gps_job *tools = queued_tools(f, "A");
    gps_job *plain = queued(f, "A", "B");
    char body[128];
    snprintf(body, sizeof body, "{\"agent_id\":\"%s\"}", x->id);
    assert_int_equal(admin(f, "POST", "/agents/deregister", body), 200);
    event_base_loop(f->fl.base, EVLOOP_NONBLOCK);
    assert_int_equal(x->state, REGISTRY_OFFLINE);
    /* the failed-over one went to the front of B's queue */
    both_on_b(f, running, tools, z);
    assert_int_equal(plain->state, GPS_JOB_QUEUED);
    assert_string_equal(plain->spec.model, "A");
    served_by(f, y, plain, "A");
}

/* X stays healthy and keeps listing A, but its poll drops supports_tools
 * for it: no name is lost, yet the tools job lost A's last agent that takes
 * tools and moves to B; the plain job stays (X and Y both still serve A).
 * A poll that keeps tools moves nothing. */
static void test_poll_drops_tools(void **state)
{
    fixture *f = *state;
    registry_agent *x, *y, *z;
    three_agents(f, &x, &y, &z);
    gps_job *tools = queued_tools(f, "A");
    gps_job *plain = queued(f, "A", "B");
    /* a new alias changes the list; tools kept: nothing moves */
    x = poll_models(f, 1, "[{\"id\":\"A\",\"aliases\":[\"al\"],\"supports_tools\":true}]");
    assert_string_equal(tools->spec.model, "A");
    assert_int_equal(sched_queue_depth(f->fl.s, "A", SCHED_INTERACTIVE), 2);
    x = poll_models(f, 1, "[{\"id\":\"A\",\"aliases\":[\"al\"]}]");
    assert_int_equal(x->state, REGISTRY_HEALTHY);
    assert_null(x->models_before);
    tools_moved_plain_stayed(f, tools, plain, y, z);
}

/* Labels are the scheduler's too: a job asking for zone x moves when A's
 * last agent in zone x drains, although A's agent in zone y still serves
 * A; B's agent in zone x serves it. A job without labels stays with A. */
static void test_drain_last_labeled_agent(void **state)
{
    fixture *f = *state;
    registry_agent *x = poll_labeled(f, 1, "[{\"id\":\"A\"}]", "{\"zone\":\"x\"}");
    registry_agent *y = poll_labeled(f, 2, "[{\"id\":\"A\"}]", "{\"zone\":\"y\"}");
    registry_agent *z = poll_labeled(f, 3, "[{\"id\":\"B\"}]", "{\"zone\":\"x\"}");
    gps_job_spec s = spec_for("A", "B");
    s.labels = calloc(1, sizeof *s.labels);
    assert_non_null(s.labels);
    s.labels[0].key = strdup("zone");
    s.labels[0].value = strdup("x");
    s.n_labels = 1;
    gps_job *zoned = fleet_submit(&f->fl, &s);
    assert_int_equal(zoned->state, GPS_JOB_QUEUED);
    gps_job *plain = queued(f, "A", "B");
    drain(f, x, true);
    tools_moved_plain_stayed(f, zoned, plain, y, z);
}

/* The fallback side asks the same: a job with tools whose fallback B is
 * served only without tools does not move there when A's agent taking
 * tools drains (the scheduler could never give it to B's agent: it would
 * fail NO_AGENT at once); it keeps waiting for A, and its agent serves it
 * once undrained. */
static void test_fallback_without_tools(void **state)
{
    fixture *f = *state;
    registry_agent *x = poll_models(f, 1, "[{\"id\":\"A\",\"supports_tools\":true}]");
    poll_models(f, 2, "[{\"id\":\"B\"}]");
    gps_job *tools = queued_tools(f, "A");
    drain(f, x, true);
    stayed_with_a(tools);
    assert_int_equal(sched_queue_depth(f->fl.s, "A", SCHED_INTERACTIVE), 1);
    drain(f, x, false);
    served_by(f, x, tools, "A");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_admin_drain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_drains_itself, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_with_another_agent_left, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_poll_drops_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_poll_drops_alias_and_shared_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_changes_before_the_move, setup, teardown),
        cmocka_unit_test_setup_teardown(test_force_remove_parked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_last_tools_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_last_tools_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_poll_drops_tools, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_last_labeled_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fallback_without_tools, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
