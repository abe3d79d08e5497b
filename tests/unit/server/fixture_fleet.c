/* fixture_fleet: see fixture_fleet.h. */
#include "fixture_fleet.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/gp_util.h"

/* The wire text must be JSON: read back, as the agent reads it. */
static json_t *wire_read(const gp_buf *jobs)
{
    json_error_t e;
    json_t *arr = json_loadb(jobs->data ? jobs->data : "", jobs->len, 0, &e);
    if (!json_is_array(arr))
        fail_msg("wire text is not a JSON array (%s): %.*s", e.text, (int)jobs->len, jobs->data);
    return arr;
}

static long long deliver(registry_agent *a, const gp_buf *jobs, void *arg)
{
    fleet *f = arg;
    if (!jobs) { /* not written (out of memory): the poll is answered 500 */
        f->refused++;
        sched_agent_unready(f->s, a);
        return -1;
    }
    f->delivered++;
    f->delivered_to = a;
    json_decref(f->delivery);
    f->delivery = wire_read(jobs);
    sched_agent_unready(f->s, a);
    return 0;
}

gps_jobs_opts fleet_opts(void)
{
    return (gps_jobs_opts){.max_queue = 10, .queue_timeout_sec = 60, .request_timeout_sec = 60,
                           .stall_timeout_sec = 60, .max_attempts = 3, .poll_interval_sec = 1};
}

void fleet_init(fleet *f, const gps_jobs_opts *o, const registry_config *rc)
{
    struct event_base *base = event_base_new();
    assert_non_null(base);
    fleet_init_on(f, base, o, rc, NULL);
    f->own_base = true;
}

void fleet_init_on(fleet *f, struct event_base *base, const gps_jobs_opts *o,
                   const registry_config *rc, struct gps_store *store)
{
    memset(f, 0, sizeof *f);
    f->base = base;
    registry_config dflt;
    if (!rc) {
        registry_config_default(&dflt);
        dflt.grace_ms = 0;
        rc = &dflt;
    }
    f->reg = registry_create(rc);
    assert_non_null(f->reg);
    gps_jobs_opts jo = o ? *o : fleet_opts();
    sched_config sc;
    sched_config_default(&sc);
    sc.max_queue = (size_t)jo.max_queue;   /* as main.c: one setting for both */
    f->s = sched_create(f->reg, &sc);
    assert_non_null(f->s);
    f->jobs = gps_jobs_new(f->base, &jo, f->reg, f->s, store, NULL);
    assert_non_null(f->jobs);
    gps_jobs_set_deliver(f->jobs, deliver, f);
}

void fleet_free(fleet *f)
{
    json_decref(f->delivery);
    gps_jobs_free(f->jobs);
    sched_destroy(f->s);
    registry_destroy(f->reg);
    if (f->own_base)
        event_base_free(f->base);
    memset(f, 0, sizeof *f);
}

registry_agent *fleet_agent(fleet *f, int i, const char *model, const char *digest, int slots,
                            uint64_t now_ms)
{
    json_t *m = json_pack("{s:s}", "id", model);
    if (digest)
        json_object_set_new(m, "digest", json_string(digest));
    char id[64], name[16];
    snprintf(id, sizeof id, "00000000-0000-4000-8000-%012x", (unsigned)i);
    snprintf(name, sizeof name, "a%d", i);
    json_t *j = json_pack("{s:s, s:s, s:[o], s:{s:i}}", "agent_id", id, "name", name, "models",
                          m, "slots", "total", slots);
    assert_non_null(j);
    registry_facts facts;
    char err[160];
    if (registry_facts_parse(j, &facts, err, sizeof err) != 0)
        fail_msg("agent %d: %s", i, err);
    json_decref(j);
    registry_agent *a = registry_heartbeat(f->reg, &facts, now_ms, 0);
    registry_facts_free(&facts);
    assert_non_null(a);
    return a;
}

gps_job_spec fleet_spec(const char *model, long long max_tokens)
{
    gps_job_spec s = {0};
    s.kind = GPS_JOB_COMPLETION;
    s.model = strdup(model);
    s.prompt = strdup("hello");
    s.max_tokens = max_tokens;
    s.temperature = 0;
    s.top_p = 1;
    s.api = "openai";
    return s;
}

gps_job *fleet_submit(fleet *f, gps_job_spec *spec)
{
    gps_submit_err err;
    gps_job *job = gps_jobs_submit(f->jobs, spec, "corr", "", &err);
    if (!job)
        fail_msg("submit refused: %d %s %s", err.status, err.code, err.message);
    return job;
}

json_t *fleet_take(fleet *f, registry_agent *a)
{
    return fleet_take_numbered(f, a, 0);
}

json_t *fleet_take_numbered(fleet *f, registry_agent *a, uint64_t delivery)
{
    gp_buf text;
    gp_buf_init(&text);
    assert_int_equal(gps_jobs_take_for_agent(f->jobs, a, 1, delivery, &text), 1);
    json_t *arr = wire_read(&text);
    gp_buf_free(&text);
    assert_int_equal(json_array_size(arr), 1);
    json_t *w = json_incref(json_array_get(arr, 0));
    json_decref(arr);
    sched_agent_unready(f->s, a);
    return w;
}

int fleet_apply(fleet *f, gps_job *job, registry_agent *a, long long seq, const char *events)
{
    json_t *ev = json_loads(events, 0, NULL);
    assert_non_null(ev);
    bool cancel;
    long long exp;
    char msg[256];
    int rc = gps_jobs_apply_events(f->jobs, job->id, a->id, seq, ev, &cancel, &exp, msg,
                                   sizeof msg);
    json_decref(ev);
    return rc;
}

bool fleet_run_until(fleet *f, bool (*pred)(void *arg), void *arg, int deadline_ms)
{
    uint64_t end = gp_now_mono_ms() + (uint64_t)deadline_ms;
    while (!pred(arg) && gp_now_mono_ms() < end)
        event_base_loop(f->base, EVLOOP_ONCE);
    return pred(arg);
}
