/*
 * agents_api_live.c: what keeps an agent's state true: the grace after its
 * long-poll closed, a restarted agent, the job list it reports, registry
 * transitions (with the deferred persistence of the states they leave),
 * and the agent's row in the store.
 */
#include "server/agents_api_priv.h"

#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/agent_check.h"
#include "server/fleet/pins.h"
#include "server/fleet/deploy.h"
#include "server/http/held.h"
#include "server/metrics.h"
#include "server/upload_read.h"
#include "server/auth/auth.h"
#include "server/store/store.h"

/* ------------------------------------------------------------------ */
/* Liveness: a closed long-poll, a restarted agent, its own job list     */
/* ------------------------------------------------------------------ */

static void grace_cancel(agent_ext *e)
{
    if (e->grace)
        evtimer_del(e->grace);
}

/* The grace after a closed long-poll ran out without a new long-poll from
 * the agent: the process is gone, and so are the attempts it was running. */
static void grace_cb(evutil_socket_t fd, short what, void *arg)
{
    agent_ext *e = arg;
    gps_agents *g = e->g;
    size_t n = gps_jobs_agent_assigned(g->jobs, e->id);
    gp_log_write(GP_LOG_WARN, "agent_disconnected", NULL,
                 json_pack("{s:s,s:I}", "agent_id", e->id, "jobs", (json_int_t)n),
                 "agent %s: no long-poll parked for %d ms (closed, or answered and not "
                 "renewed); ending its jobs' attempts", e->id, g->opts.disconnect_grace_ms);
    if (n)
        gps_jobs_agent_lost(g->jobs, e->id, "agent_disconnected");
}

/* The parked long-poll of an agent that speaks the liveness protocol
 * closed. With jobs assigned, wait disconnect_grace_ms for it to park
 * again (a live agent does so within a round trip of any reply or error);
 * only a new /agents/work cancels the wait, never a poll or an upload that
 * may have been in flight when the process died. */
static void grace_arm(gps_agents *g, agent_ext *e)
{
    if (!g->base || !g->jobs || gps_jobs_agent_assigned(g->jobs, e->id) == 0)
        return;
    if (!e->grace)
        e->grace = evtimer_new(g->base, grace_cb, e);
    if (!e->grace)
        return;
    int ms = g->opts.disconnect_grace_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(e->grace, &tv);
}

/* We answered the agent's long-poll (204 at work_wait, or jobs): a live
 * agent parks the next one within a round trip. Until it does, nothing
 * would notice its death, so the same grace runs from the answer. */
void agents_await_repark(gps_agents *g, agent_ext *e)
{
    registry_agent *a = g->reg ? registry_get(g->reg, e->id) : NULL;
    if (a && a->instance[0])
        grace_arm(g, e);
}

void gps_agents_poll_closed(gps_agents *g, const char *agent_id)
{
    registry_agent *a = g->reg ? registry_get(g->reg, agent_id) : NULL;
    if (!a)
        return;
    registry_mark_suspect(g->reg, a, gp_now_mono_ms(), "poll_disconnected");
    agent_ext *e = agents_ext_get(g, agent_id, true);
    if (e && a->instance[0])
        grace_arm(g, e);
}

void gps_agents_poll_reopened(gps_agents *g, const char *agent_id)
{
    agent_ext *e = agents_ext_get(g, agent_id, false);
    if (e)
        grace_cancel(e);
}

/* "<epoch>.<n>" of this process -> n; anything else (another server
 * process, garbage) -> 0: judge nothing by it. */
static uint64_t delivery_number(const gps_agents *g, const char *tok)
{
    size_t el = strlen(g->epoch);
    if (!tok || strncmp(tok, g->epoch, el) != 0 || tok[el] != '.')
        return 0;
    char *end = NULL;
    unsigned long long n = strtoull(tok + el + 1, &end, 10);
    return end && *end == '\0' && n <= g->deliveries ? (uint64_t)n : 0;
}

/* An agent process's "instance": 8 to 64 characters [A-Za-z0-9_-]. */
bool agents_instance_ok(const char *s, size_t n)
{
    bool ok = s && n >= 8 && n <= 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
             (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '-' || s[i] == '_';
    return ok;
}

/* The liveness fields of a poll/work/events body (all optional). On a bad
 * one, a 400 naming it has been sent and false is returned. */
bool agents_liveness_parse(gps_agents *g, gps_req *r, const json_t *body, liveness *out)
{
    memset(out, 0, sizeof *out);
    const json_t *in = json_object_get(body, "instance");
    if (in && !json_is_null(in)) {
        const char *s = json_string_value(in);
        if (!agents_instance_ok(s, s ? json_string_length(in) : 0)) {
            gps_req_error(r, 400, "INVALID_REQUEST",
                          "'instance' must be 8 to 64 characters [A-Za-z0-9_-]", "instance");
            return false;
        }
        out->instance = s;
    }
    const json_t *rj = json_object_get(body, "running_jobs");
    if (rj && !json_is_null(rj)) {
        bool ok = json_is_array(rj) && json_array_size(rj) <= 1024;
        size_t i;
        const json_t *v;
        json_array_foreach(rj, i, v) {
            if (!ok)
                break;
            ok = json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < 128;
        }
        if (!ok) {
            gps_req_error(r, 400, "INVALID_REQUEST",
                          "'running_jobs' must be an array of at most 1024 job id strings",
                          "running_jobs");
            return false;
        }
        out->running = rj;
    }
    const json_t *ds = json_object_get(body, "delivery_seen");
    if (ds && !json_is_null(ds)) {
        if (!json_is_string(ds) || json_string_length(ds) > 64) {
            gps_req_error(r, 400, "INVALID_REQUEST",
                          "'delivery_seen' must be the `delivery` string of a work reply",
                          "delivery_seen");
            return false;
        }
        out->seen = delivery_number(g, json_string_value(ds));
    }
    return true;
}

/* Act on what a request says about the agent process: a new instance ends
 * every attempt of the previous process at once; the job list restarts the
 * stall timer of what runs and ends what the agent no longer has. */
void agents_liveness_apply(gps_agents *g, registry_agent *a, const liveness *lv)
{
    if (registry_note_instance(a, lv->instance)) {
        agent_ext *e = agents_ext_get(g, a->id, false);
        if (e)
            grace_cancel(e);
        if (e && e->parked) {
            /* The old process's long-poll (its close went unseen): no job
             * may be handed to it any more. */
            struct evhttp_request *old = e->parked;
            agents_unpark(e);
            agents_reply_204(old);
        }
        size_t n = gps_jobs_agent_assigned(g->jobs, a->id);
        gp_log_write(GP_LOG_WARN, "agent_restarted", NULL,
                     json_pack("{s:s,s:s,s:I}", "agent_id", a->id, "instance", lv->instance,
                               "jobs", (json_int_t)n),
                     "agent %s: a new process; ending the previous one's jobs", a->id);
        if (n)
            gps_jobs_agent_lost(g->jobs, a->id, "agent_restarted");
    }
    gps_jobs_agent_report(g->jobs, a->id, lv->running, lv->seen);
}

/* The parked long-poll's connection closed: a crashed or cut-off agent.
 * Mark it suspect at once so nothing more is routed to it. */
void agents_park_gone(void *arg)
{
    agent_ext *e = arg;
    gps_agents *g = e->g;
    agents_unpark(e); /* held.c dropped the request */
    gp_log_write(GP_LOG_WARN, "agent_poll_disconnected", NULL,
                 json_pack("{s:s}", "agent_id", e->id),
                 "parked long-poll connection closed");
    gps_agents_poll_closed(g, e->id);
}

long long agents_deliver_cb(registry_agent *a, const gp_buf *jobs, void *arg)
{
    gps_agents *g = arg;
    agent_ext *e = agents_ext_get(g, a->id, false);
    if (!e || !e->parked || e->free_slots == 0) {
        sched_agent_unready(g->sched, a);
        return -1;
    }
    struct evhttp_request *req = e->parked;
    agents_unpark(e);
    uint64_t n = ++g->deliveries;
    /* Not handed over (a 500 went instead): the caller requeues the job. */
    if (agents_reply_jobs(g, e, req, jobs, n) < 0)
        return -1;
    return (long long)n;
}

/* If agent a is parked and can take work now, hand it queued jobs. */
void agents_dispatch_parked(gps_agents *g, agent_ext *e)
{
    if (!e->parked || e->free_slots == 0)
        return;
    registry_agent *a = registry_get(g->reg, e->id);
    if (!a || a->state != REGISTRY_HEALTHY)
        return;
    /* Its poll answered with the jobs, or 500 with them back in their
     * queues (agents_deliver_cb), or still parked and ready: none for it. */
    gps_jobs_hand_out(g->jobs, a, e->free_slots, agents_deliver_cb, g);
}

/* ------------------------------------------------------------------ */
/* Registry transitions                                                */
/* ------------------------------------------------------------------ */

static void deferred_one(void *ud, registry_agent *a)
{
    gps_agents *g = ud;
    /* Its poll stopped listing a model (unloaded, a replica scaled down):
     * queued jobs of a name no live agent serves now move to their
     * fallbacks (registry.h models_before: no flag of ours to lose). */
    if (a->models_before)
        gps_jobs_models_dropped(g->jobs, a->id);
    agent_ext *e = agents_ext_get(g, a->id, false);
    if (!e)
        return;
    if (e->lost_pending) {
        e->lost_pending = false;
        if (a->state == REGISTRY_DEAD || a->state == REGISTRY_OFFLINE)
            gps_jobs_agent_lost(g->jobs, a->id, a->state == REGISTRY_DEAD ? "agent_dead"
                                                                           : "agent_offline");
    }
    if (e->leave_pending) {
        e->leave_pending = false;
        if (a->state == REGISTRY_DRAINING) /* (not undrained meanwhile) */
            gps_jobs_agent_leaving(g->jobs, a->id);
    }
    if (e->kick_pending) {
        e->kick_pending = false;
        agents_dispatch_parked(g, e);
    }
}

void agents_deferred_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_agents *g = arg;
    registry_foreach(g->reg, deferred_one, g);
}

static void persist_state(gps_agents *g, registry_agent *a)
{
    if (g->store && gps_store_agent_state(g->store, a->id, registry_state_name(a->state),
                                          gp_now_wall_ms()) < 0 && g->metrics)
        gps_metrics_add(g->metrics, "db_errors_total", NULL, 1);
}

typedef struct name_probe {
    const registry_agent *self;
    const registry_agent *other; /* first other agent with self's name */
} name_probe;

static void name_one(void *ud, registry_agent *a)
{
    name_probe *p = ud;
    if (!p->other && a != p->self && a->name && strcmp(a->name, p->self->name) == 0)
        p->other = a;
}

/* Two agents with one name make logs, legends and `gpupoolctl agents drain
 * NAME` ambiguous: say so when an agent (re)joins. Not refused: the id is
 * the identity, and a name may be reused on purpose after a rebuild. */
static void warn_duplicate_name(gps_agents *g, const registry_agent *a)
{
    if (!a->name || !*a->name)
        return;
    name_probe p = {a, NULL};
    registry_foreach(g->reg, name_one, &p);
    if (!p.other)
        return;
    gp_log_write(GP_LOG_WARN, "agent_name_duplicate", NULL,
                 json_pack("{s:s,s:s,s:s,s:s}", "agent_id", a->id, "name", a->name, "other_id",
                           p.other->id, "other_state", registry_state_name(p.other->state)),
                 "agent %s uses the name '%s' of agent %s (%s): give each box its own --name, "
                 "or forget the old one (gpupoolctl agents remove %s)",
                 a->id, a->name, p.other->id, registry_state_name(p.other->state), p.other->id);
}

void gps_agents_on_transition(void *ud, registry_agent *a, registry_state old_state,
                              registry_state new_state, const char *reason, uint64_t now_ms)
{
    gps_agents *g = ud;
    if (g->reg && (old_state == REGISTRY_REGISTERING || old_state == REGISTRY_OFFLINE ||
                   old_state == REGISTRY_DEAD) &&
        (new_state == REGISTRY_HEALTHY || new_state == REGISTRY_DRAINING))
        warn_duplicate_name(g, a);
    gp_log_level lvl = new_state == REGISTRY_DEAD || new_state == REGISTRY_SUSPECT
                           ? GP_LOG_WARN
                           : GP_LOG_INFO;
    gp_log_write(lvl, "agent_state", NULL,
                 json_pack("{s:s,s:s,s:s,s:s,s:s}", "agent_id", a->id, "name",
                           a->name ? a->name : "", "from", registry_state_name(old_state), "to",
                           registry_state_name(new_state), "reason", reason ? reason : ""),
                 "agent %s -> %s", a->id, registry_state_name(new_state));
    if (!g->sched)
        return;
    sched_agent_update(g->sched, a);
    agent_ext *e = agents_ext_get(g, a->id, true);
    if (old_state != REGISTRY_REGISTERING || new_state != REGISTRY_HEALTHY)
        if (e && e->persisted_once)
            persist_state(g, a);
    if (!e)
        return;
    /* Failover and dispatch re-enter the registry and scheduler: run them
     * from a zero-delay event, not inside the registry's own call. */
    if (new_state == REGISTRY_DEAD || new_state == REGISTRY_OFFLINE)
        e->lost_pending = true;
    if (new_state == REGISTRY_HEALTHY)
        e->kick_pending = true;
    /* A drain (the admin's or the agent's own) lets running jobs finish,
     * but queued ones of a model it was the last to serve would wait out
     * queue_timeout: those with a fallback move now. */
    if (new_state == REGISTRY_DRAINING)
        e->leave_pending = true;
    if ((e->lost_pending || e->kick_pending || e->leave_pending) && g->deferred)
        event_active(g->deferred, EV_TIMEOUT, 0);
}

void agents_tick_cb(evutil_socket_t fd, short what, void *arg)
{
    gps_agents *g = arg;
    uint64_t now = gp_now_mono_ms();
    registry_tick(g->reg, now);
    sched_tick(g->sched, now);
    /* Replicas of agents gone past the grace move even when no agent
     * polls; once a second is plenty. */
    if (g->deploy && now >= g->deploy_next_ms) {
        g->deploy_next_ms = now + 1000;
        gps_deploy_reconcile(g->deploy, now, gp_now_wall_ms());
    }
}

/* ------------------------------------------------------------------ */
/* Persistence of agents                                               */
/* ------------------------------------------------------------------ */

void agents_persist_agent(gps_agents *g, registry_agent *a, agent_ext *e, const char *key_id)
{
    if (!g->store)
        return;
    json_t *labels = json_object();
    for (size_t i = 0; i < a->n_labels; i++)
        json_object_set_new(labels, a->labels[i].key, json_string(a->labels[i].value));
    gps_store_agent_row row = {
        .id = a->id,
        .name = a->name,
        .version = a->version,
        .platform = a->platform,
        .state = registry_state_name(a->state),
        .labels = labels,
        .facts = a->facts,
        .key_id = key_id && *key_id ? key_id : NULL,
        .last_seen = gp_now_wall_ms(),
    };
    int rc = gps_store_agent_upsert(g->store, row);
    json_decref(labels);
    if (rc == 0 && (!e->persisted_once || e->persisted_models_gen != a->models_gen)) {
        gps_store_model_row *rows = calloc(a->n_models ? a->n_models : 1, sizeof *rows);
        if (rows) {
            for (size_t i = 0; i < a->n_models; i++) {
                registry_model_info *m = &a->models[i];
                rows[i] = (gps_store_model_row){
                    .model = m->id,
                    .aliases = (const char *const *)m->aliases,
                    .n_aliases = m->n_aliases,
                    .quantization = m->quantization,
                    .context_length = m->context_length,
                    .vram_bytes = m->vram_bytes,
                    .loaded = m->loaded,
                };
            }
            rc = gps_store_agent_models(g->store, a->id, rows, a->n_models);
            free(rows);
        }
        e->persisted_models_gen = a->models_gen;
    }
    e->persisted_once = true;
    if (g->metrics)
        gps_metrics_add(g->metrics, rc == 0 ? "db_writes_total" : "db_errors_total", NULL, 1);
}
