/* agents_api: see agents_api.h. */
#include "server/agents_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/agent_check.h"
#include "server/fleet/pins.h"
#include "server/fleet/deploy.h"
#include "server/fleet/gps_strmap.h"
#include "server/http/held.h"
#include "server/http/http.h"
#include "server/http/sse.h" /* gps_json_escape_append */
#include "server/metrics.h"
#include "server/upload_read.h"
#include "server/auth/auth.h"
#include "server/store/store.h"

/* Per-agent state of this module (not the registry's): the parked
 * long-poll and what was last persisted. */
typedef struct agent_ext {
    gps_agents *g;
    char id[37];
    struct evhttp_request *parked;      /* NULL when none */
    gps_held held;                /* the parked request (held.h) */
    struct event *timer;
    int free_slots;
    char park_cid[65];                  /* correlation id of the parked request */
    char key_id[65];                    /* key of the agent's last poll/work ("" = auth off) */
    uint32_t persisted_models_gen;
    bool persisted_once;
    struct event *grace;                /* parked long-poll closed with jobs assigned:
                                           ends their attempts unless the agent re-parks */
    bool lost_pending;                  /* deferred failover queued */
    bool kick_pending;                  /* deferred dispatch queued */
} agent_ext;

struct gps_agents {
    struct event_base *base;
    gps_agents_opts opts;
    struct gps_store *store;
    gps_metrics *metrics;
    gps_metrics *collect_m;        /* during gps_agents_collect only */
    registry *reg;
    sched *sched;
    gps_jobs *jobs;
    struct gps_auth *auth;
    gps_pins *pins;                     /* model attestation; NULL: none */
    gps_deploy *deploy;                 /* deployments; NULL: none */
    uint64_t deploy_next_ms;            /* next reconcile from the tick */
    smap ext;                           /* agent id -> agent_ext */
    struct event *tick;
    struct event *deferred;             /* runs failovers/kicks outside callbacks */
    size_t nparked;                     /* parked long-polls asking for work */
    size_t nliveness;                   /* parked free_slots 0 long-polls (busy agents) */
    char epoch[17];                     /* this process's random id: delivery tokens */
    uint64_t deliveries;                /* work replies with jobs sent so far */
};

static agent_ext *ext_get(gps_agents *g, const char *id, bool create)
{
    agent_ext *e = smap_get(&g->ext, id);
    if (e || !create)
        return e;
    e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->g = g;
    snprintf(e->id, sizeof e->id, "%s", id);
    if (!smap_put(&g->ext, id, e)) {
        free(e);
        return NULL;
    }
    return e;
}

/* ------------------------------------------------------------------ */
/* Parked long-polls                                                   */
/* ------------------------------------------------------------------ */

/* Forget the parked request without answering it (it is answered by the
 * caller, or already freed by evhttp). */
static void unpark(agent_ext *e)
{
    if (!e->parked)
        return;
    gps_held_release(&e->held);
    if (e->timer) {
        event_free(e->timer);
        e->timer = NULL;
    }
    e->parked = NULL;
    if (e->free_slots > 0)
        e->g->nparked--;
    else
        e->g->nliveness--;
    registry_agent *a = e->g->reg ? registry_get(e->g->reg, e->id) : NULL;
    if (a)
        sched_agent_unready(e->g->sched, a);
}

static void await_repark(gps_agents *g, agent_ext *e);

/* Hand jobs (wire objects) to an agent. The reply carries a delivery token
 * "<epoch>.<n>" the agent echoes as `delivery_seen` once it has read it; the
 * jobs remember n (gps_jobs_agent_report). The epoch keeps a restarted
 * server from reading an older process's numbers. */
/* The work reply: {"jobs":[...],"delivery":"EPOCH.N"}, written around the
 * jobs' wire text (gps_jobs_take_for_agent: the bytes the jansson reply
 * dumped). delivery is n, which the jobs already carry. */
static void reply_jobs(gps_agents *g, agent_ext *e, struct evhttp_request *req,
                       const gp_buf *jobs, uint64_t n)
{
    char tok[48];
    snprintf(tok, sizeof tok, "%s.%llu", g->epoch, (unsigned long long)n);
    gp_buf body;
    gp_buf_init(&body);
    if (gp_buf_append(&body, "{\"jobs\":", 8) < 0 ||
        gp_buf_append(&body, jobs->data, jobs->len) < 0 ||
        gp_buf_append(&body, ",\"delivery\":\"", 13) < 0 ||
        gp_json_escape_append(&body, tok, strlen(tok)) < 0 ||
        gp_buf_append(&body, "\"}", 2) < 0)
        gps_http_send_error(req, GPS_DIALECT_NATIVE, 500, "INTERNAL", "out of memory", NULL,
                            NULL, NULL);
    else
        gps_http_send_json_text(req, 200, body.data, body.len);
    gp_buf_free(&body);
    await_repark(g, e);
}

static void reply_204(struct evhttp_request *req)
{
    gps_http_add_date(req);
    evhttp_send_reply(req, 204, "No Content", NULL);
}

static void park_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    agent_ext *e = arg;
    struct evhttp_request *req = e->parked;
    if (!req)
        return;
    unpark(e);
    reply_204(req);
    await_repark(e->g, e);
}

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
static void await_repark(gps_agents *g, agent_ext *e)
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
    agent_ext *e = ext_get(g, agent_id, true);
    if (e && a->instance[0])
        grace_arm(g, e);
}

void gps_agents_poll_reopened(gps_agents *g, const char *agent_id)
{
    agent_ext *e = ext_get(g, agent_id, false);
    if (e)
        grace_cancel(e);
}

typedef struct liveness {
    const char *instance;    /* NULL: an older agent */
    const json_t *running;   /* running_jobs, NULL when absent */
    uint64_t seen;           /* delivery_seen of this server process, 0 = none */
} liveness;

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
static bool instance_ok(const char *s, size_t n)
{
    bool ok = s && n >= 8 && n <= 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
             (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '-' || s[i] == '_';
    return ok;
}

/* The liveness fields of a poll/work/events body (all optional). On a bad
 * one, a 400 naming it has been sent and false is returned. */
static bool liveness_parse(gps_agents *g, gps_req *r, const json_t *body, liveness *out)
{
    memset(out, 0, sizeof *out);
    const json_t *in = json_object_get(body, "instance");
    if (in && !json_is_null(in)) {
        const char *s = json_string_value(in);
        if (!instance_ok(s, s ? json_string_length(in) : 0)) {
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
static void liveness_apply(gps_agents *g, registry_agent *a, const liveness *lv)
{
    if (registry_note_instance(a, lv->instance)) {
        agent_ext *e = ext_get(g, a->id, false);
        if (e)
            grace_cancel(e);
        if (e && e->parked) {
            /* The old process's long-poll (its close went unseen): no job
             * may be handed to it any more. */
            struct evhttp_request *old = e->parked;
            unpark(e);
            reply_204(old);
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
static void park_gone(void *arg)
{
    agent_ext *e = arg;
    gps_agents *g = e->g;
    unpark(e); /* held.c dropped the request */
    gp_log_write(GP_LOG_WARN, "agent_poll_disconnected", NULL,
                 json_pack("{s:s}", "agent_id", e->id),
                 "parked long-poll connection closed");
    gps_agents_poll_closed(g, e->id);
}

static long long deliver_cb(registry_agent *a, const gp_buf *jobs, void *arg)
{
    gps_agents *g = arg;
    agent_ext *e = ext_get(g, a->id, false);
    if (!e || !e->parked || e->free_slots == 0) {
        sched_agent_unready(g->sched, a);
        return -1;
    }
    struct evhttp_request *req = e->parked;
    unpark(e);
    uint64_t n = ++g->deliveries;
    reply_jobs(g, e, req, jobs, n);
    return (long long)n;
}

/* If agent a is parked and can take work now, hand it queued jobs. */
static void dispatch_parked(gps_agents *g, agent_ext *e)
{
    if (!e->parked || e->free_slots == 0)
        return;
    registry_agent *a = registry_get(g->reg, e->id);
    if (!a || a->state != REGISTRY_HEALTHY)
        return;
    gp_buf jobs;
    gp_buf_init(&jobs);
    uint64_t n = g->deliveries + 1;
    if (gps_jobs_take_for_agent(g->jobs, a, e->free_slots, n, &jobs) > 0) {
        struct evhttp_request *req = e->parked;
        unpark(e);
        g->deliveries = n;
        reply_jobs(g, e, req, &jobs, n);
    }
    gp_buf_free(&jobs);
}

/* ------------------------------------------------------------------ */
/* Registry transitions                                                */
/* ------------------------------------------------------------------ */

static void deferred_one(void *ud, registry_agent *a)
{
    gps_agents *g = ud;
    agent_ext *e = ext_get(g, a->id, false);
    if (!e)
        return;
    if (e->lost_pending) {
        e->lost_pending = false;
        if (a->state == REGISTRY_DEAD || a->state == REGISTRY_OFFLINE)
            gps_jobs_agent_lost(g->jobs, a->id, a->state == REGISTRY_DEAD ? "agent_dead"
                                                                           : "agent_offline");
    }
    if (e->kick_pending) {
        e->kick_pending = false;
        dispatch_parked(g, e);
    }
}

static void deferred_cb(evutil_socket_t fd, short what, void *arg)
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
    agent_ext *e = ext_get(g, a->id, true);
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
    if ((e->lost_pending || e->kick_pending) && g->deferred)
        event_active(g->deferred, EV_TIMEOUT, 0);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
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

static void persist_agent(gps_agents *g, registry_agent *a, agent_ext *e, const char *key_id)
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

/* ------------------------------------------------------------------ */
/* Handlers                                                            */
/* ------------------------------------------------------------------ */

static const char *body_agent_id(gps_req *r, json_t *body)
{
    const char *id = json_string_value(json_object_get(body, "agent_id"));
    if (!id || !gp_uuid_valid(id)) {
        gps_req_error(r, 400, "INVALID_REQUEST", "'agent_id' must be a UUID string", "agent_id");
        return NULL;
    }
    return id;
}

/* An agent key is bound to one agent_id and an agent_id to one key: refuse
 * (403) a request made with a key bound to another agent_id
 * (KEY_BOUND_TO_OTHER_AGENT) or naming an agent_id another key holds
 * (AGENT_ID_TAKEN). A still unbound key is bound by its first poll, work
 * request or event upload. True when the request may go on. */
static bool key_allows(gps_agents *g, gps_req *r, const char *agent_id)
{
    if (!g->auth || !r->key_id[0])
        return true;
    const gps_auth_key *k = gps_auth_key_find(g->auth, r->key_id);
    if (!k)
        return true;
    int rc = gps_auth_bind_agent(g->auth, k, agent_id);
    if (rc == 0)
        return true;
    if (rc == -2) {
        gp_log_write(GP_LOG_WARN, "agent_id_taken", r->correlation_id,
                     json_pack("{s:s,s:s}", "agent_id", agent_id, "key_id", k->id),
                     "a key tried to use an agent_id bound to another key");
        gps_req_error(r, 403, "AGENT_ID_TAKEN",
                      "this agent_id is bound to another agent key; an agent keeps its own "
                      "agent_id (a new agent needs a new one)",
                      "agent_id");
    } else {
        gps_req_error(r, 403, "KEY_BOUND_TO_OTHER_AGENT",
                      "this agent key is bound to another agent_id", "agent_id");
    }
    return false;
}

static void h_poll(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    registry_facts f;
    char err[256];
    if (registry_facts_parse(body, &f, err, sizeof err) < 0) {
        registry_facts_free(&f);
        json_decref(body);
        gps_req_error(r, 400, "INVALID_REQUEST", err, NULL);
        return;
    }
    liveness lv;
    if (!key_allows(g, r, f.agent_id) || !liveness_parse(g, r, body, &lv)) {
        registry_facts_free(&f);
        json_decref(body);
        return;
    }
    size_t max_agents = g->opts.max_agents > 0 ? (size_t)g->opts.max_agents : 1024;
    if (!registry_get(g->reg, f.agent_id) && registry_count(g->reg) >= max_agents) {
        registry_facts_free(&f);
        json_decref(body);
        gp_log_write(GP_LOG_WARN, "agent_limit", r->correlation_id,
                     json_pack("{s:I}", "max_agents", (json_int_t)max_agents),
                     "a new agent was refused: the server knows max_agents agents");
        gps_req_add_header(r, "Retry-After", "60");
        char msg[200];
        snprintf(msg, sizeof msg,
                 "the server knows %zu agents (max_agents), dead ones included: an admin must "
                 "remove some (DELETE /admin/agents/{id}) before a new one can register",
                 max_agents);
        gps_req_error(r, 503, "AGENT_LIMIT", msg, NULL);
        return;
    }
    /* Models whose file does not match an operator's pin never reach the
     * registry: nothing can be routed to them (pins.h). */
    size_t refused = g->pins ? gps_pins_filter(g->pins, &f) : 0;
    registry_agent *a = registry_heartbeat(g->reg, &f, gp_now_mono_ms(), gp_now_wall_ms());
    registry_facts_free(&f);
    if (!a) {
        json_decref(body);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    liveness_apply(g, a, &lv);
    /* What the agent must hold (deploy.h): only for agents that take
     * deployments; older agents never see the member. */
    json_t *deployments = g->deploy ? gps_deploy_agent_poll(g->deploy, a, body, gp_now_mono_ms(),
                                                            gp_now_wall_ms())
                                    : NULL;
    json_decref(body); /* lv pointed into it */
    sched_agent_update(g->sched, a);
    agent_ext *e = ext_get(g, a->id, true);
    if (e) {
        snprintf(e->key_id, sizeof e->key_id, "%s", r->key_id);
        persist_agent(g, a, e, r->key_id);
        dispatch_parked(g, e);
    }
    json_t *commands = gps_jobs_pending_cancels(g->jobs, a->id);
    if (a->admin_drain)
        json_array_append_new(commands, json_pack("{s:s}", "type", "drain"));
    /* features: what this server takes beyond the first protocol, so that
     * a newer agent uses it only here (events_batch: POST /agents/events). */
    json_t *reply = json_pack("{s:s,s:s,s:i,s:i,s:o,s:[s]}", "agent_id", a->id, "state",
                              registry_state_name(a->state), "poll_interval_sec",
                              g->opts.poll_interval_sec, "work_wait_sec", g->opts.work_wait_sec,
                              "commands", commands, "features", "events_batch");
    /* Tell the agent, so that its own log says why a model gets no work. */
    if (reply && refused)
        json_object_set(reply, "refused_models", gps_pins_refused(g->pins, a->id));
    if (reply && deployments)
        json_object_set(reply, "deployments", deployments);
    json_decref(deployments);
    gps_http_send_json(r->req, 200, reply);
}

/* POST /agents/deregister {agent_id, instance?}: a clean stop. The agent
 * goes OFFLINE (no work, not counted as down: GpupoolAgentDown ignores
 * it) until its next poll. An instance that is not the registered one (a
 * newer process took the agent_id over) changes nothing. Idempotent. */
static void h_deregister(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    const char *id = body_agent_id(r, body);
    if (!id || !key_allows(g, r, id)) {
        json_decref(body);
        return;
    }
    const char *inst = json_string_value(json_object_get(body, "instance"));
    registry_agent *a = registry_get(g->reg, id);
    if (!a) {
        json_decref(body);
        gps_req_error(r, 404, "AGENT_NOT_FOUND", "unknown agent", "agent_id");
        return;
    }
    bool stale = inst && a->instance[0] && strcmp(inst, a->instance) != 0;
    if (!stale && a->state != REGISTRY_OFFLINE) {
        /* Answer its parked long-poll first: the close that follows the
         * agent's exit must not read as a death. */
        agent_ext *e = ext_get(g, id, false);
        if (e && e->parked) {
            struct evhttp_request *req = e->parked;
            unpark(e);
            reply_204(req);
        }
        registry_deregister(g->reg, a, gp_now_mono_ms());
        gp_log_write(GP_LOG_INFO, "agent_deregistered", r->correlation_id,
                     json_pack("{s:s,s:s}", "agent_id", a->id, "name", a->name ? a->name : ""),
                     "agent %s (%s) stopped cleanly: offline", a->id, a->name ? a->name : "");
    }
    json_decref(body);
    gps_http_send_json(r->req, 200,
                       json_pack("{s:s,s:s}", "agent_id", a->id, "state",
                                 registry_state_name(a->state)));
}

static void h_work(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    /* The usual body without jansson's parser (upload_read.h); any other
     * is parsed, and its errors worded, as before. */
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    size_t n = in ? evbuffer_get_length(in) : 0;
    const char *raw = n ? (const char *)evbuffer_pullup(in, -1) : NULL;
    json_t *body = raw ? gps_work_read(raw, n) : NULL;
    if (!body)
        body = gps_req_json(r);
    if (!body)
        return;
    const char *id = body_agent_id(r, body);
    if (!id || !key_allows(g, r, id)) {
        json_decref(body);
        return;
    }
    json_t *fs = json_object_get(body, "free_slots");
    if (!json_is_integer(fs) || json_integer_value(fs) < 0 || json_integer_value(fs) > 1024) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_REQUEST", "'free_slots' must be an integer in 0..1024",
                      "free_slots");
        return;
    }
    liveness lv;
    if (!liveness_parse(g, r, body, &lv)) {
        json_decref(body);
        return;
    }
    int free_slots = (int)json_integer_value(fs);
    registry_agent *a = registry_get(g->reg, id);
    if (!a) {
        json_decref(body);
        gps_req_error(r, 409, "NOT_REGISTERED",
                      "unknown agent: call POST /agents/poll first", "agent_id");
        return;
    }
    registry_touch(g->reg, a, gp_now_mono_ms());
    agent_ext *e = ext_get(g, a->id, true);
    if (!e) {
        json_decref(body);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    /* A new long-poll: the process is alive (a closed one's grace ends). */
    gps_agents_poll_reopened(g, a->id);
    liveness_apply(g, a, &lv);
    /* What its slots hold now (a job just ended): fresher than the last
     * poll's, for prefix routing. Indexed when the scheduler sees it ready. */
    char perr[256];
    if (registry_agent_set_prefix(a, json_object_get(body, "prefix_cache"), perr,
                                  sizeof perr) < 0) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_REQUEST", perr, "prefix_cache");
        return;
    }
    json_decref(body);
    if (e->parked) {
        /* A second long-poll replaces the first (the agent gave up on it). */
        struct evhttp_request *old = e->parked;
        unpark(e);
        reply_204(old);
    }
    /* free_slots 0: a busy agent's liveness channel; parked, never given jobs. */
    gp_buf jobs;
    gp_buf_init(&jobs);
    uint64_t dn = g->deliveries + 1;
    if (free_slots > 0 && gps_jobs_take_for_agent(g->jobs, a, free_slots, dn, &jobs) > 0) {
        sched_agent_unready(g->sched, a);
        g->deliveries = dn;
        reply_jobs(g, e, r->req, &jobs, dn);
        gp_buf_free(&jobs);
        return;
    }
    gp_buf_free(&jobs);
    /* Park. The agent stays ready in the scheduler (take_for_agent made it
     * so) until this request is answered or its connection closes. The key
     * is kept so that revoking it ends the poll at once. */
    e->parked = r->req;
    snprintf(e->park_cid, sizeof e->park_cid, "%s", r->correlation_id);
    snprintf(e->key_id, sizeof e->key_id, "%s", r->key_id);
    e->free_slots = free_slots;
    if (free_slots > 0) {
        g->nparked++;
    } else {
        g->nliveness++;
        sched_agent_unready(g->sched, a);
    }
    gps_held_start(&e->held, r->req, true, g->opts.work_wait_sec + 30, park_gone, e);
    e->timer = evtimer_new(g->base, park_timeout_cb, e);
    struct timeval tv = {g->opts.work_wait_sec, 0};
    if (e->timer)
        evtimer_add(e->timer, &tv);
}

/* Apply one job's events (already checked by gps_agent_events_check) and
 * say how it went, as the single-job route answers and as one entry of a
 * batch: *status 200 with cancel, or an error code, message and details. */
typedef struct apply_result {
    int status;
    const char *code;            /* NULL when 200 */
    char msg[256];
    bool cancel;
    long long expected_seq;      /* SEQ_GAP: >= 0 */
} apply_result;

static void apply_result_set(int rc, apply_result *out)
{
    switch (rc) {
    case 0:
        out->status = 200;
        break;
    case 404:
        out->status = 404;
        out->code = "JOB_NOT_FOUND";
        break;
    case 409:
        out->status = 409;
        out->code = out->expected_seq >= 0 ? "SEQ_GAP" : "NOT_ASSIGNED";
        break;
    default:
        out->status = 400;
        out->code = "INVALID_REQUEST";
        break;
    }
}

static void apply_job_events(gps_agents *g, const char *job_id, const char *agent_id,
                             const json_t *seq, const json_t *events, apply_result *out)
{
    memset(out, 0, sizeof *out);
    out->expected_seq = -1;
    int rc = gps_jobs_apply_checked_events(g->jobs, job_id, agent_id, json_integer_value(seq),
                                           (json_t *)events, &out->cancel, &out->expected_seq,
                                           out->msg, sizeof out->msg);
    apply_result_set(rc, out);
}

/* gpupool_agent_uploads_total{route} and the job entries they carried.
 * label: route="job" or route="batch", as gps_metrics_label writes it
 * (written out: a label built per upload was a tenth of a batch's own
 * cost). */
#define ROUTE_JOB "route=\"job\""
#define ROUTE_BATCH "route=\"batch\""
static void count_upload(gps_agents *g, const char *label, size_t entries)
{
    gps_metrics *m = gps_jobs_metrics(g->jobs);
    if (!m)
        return;
    gps_metrics_add(m, "agent_uploads_total", label, 1);
    gps_metrics_add(m, "agent_upload_entries_total", label, (double)entries);
}

/* A new instance is noticed on any request (its first may be an upload of
 * a job the old process had: refused when applied, as reassigned). */
static bool events_liveness(gps_agents *g, gps_req *r, json_t *body, const char *id)
{
    liveness lv;
    if (!liveness_parse(g, r, body, &lv))
        return false;
    registry_agent *ra = registry_get(g->reg, id);
    if (ra && lv.instance) {
        lv.running = NULL;
        liveness_apply(g, ra, &lv);
    }
    return true;
}

static void h_events(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    /* Every field and number first (agent_check.h): a bad value refuses
     * the whole upload, so none of its events is applied. */
    char field[96], emsg[256];
    if (gps_agent_events_check(body, field, sizeof field, emsg, sizeof emsg) < 0) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_EVENT", emsg, field);
        return;
    }
    const char *id = json_string_value(json_object_get(body, "agent_id"));
    if (!key_allows(g, r, id) || !events_liveness(g, r, body, id)) {
        json_decref(body);
        return;
    }
    apply_result res;
    apply_job_events(g, r->params[0], id, json_object_get(body, "seq"),
                     json_object_get(body, "events"), &res);
    json_decref(body);
    count_upload(g, ROUTE_JOB, 1);
    if (res.status == 200)
        gps_http_send_json(r->req, 200, json_pack("{s:b}", "cancel", res.cancel));
    else if (res.expected_seq >= 0)
        gps_http_send_error(r->req, GPS_DIALECT_NATIVE, 409, "SEQ_GAP", res.msg, NULL,
                            r->correlation_id,
                            json_pack("{s:{s:I}}", "details", "expected_seq",
                                      (json_int_t)res.expected_seq));
    else
        gps_req_error(r, res.status, res.code, res.msg,
                      res.status == 400 ? "events" : NULL);
}

/* POST /agents/events: the events of several jobs of one agent in one
 * request (docs/protocol.md "Batched uploads"). Each entry is judged alone,
 * exactly as its own POST /agents/jobs/{id}/events would be (a bad entry
 * refuses that entry only), and the reply lists every entry's outcome in
 * order. One request instead of one per job: at 50 tokens/s per stream
 * the per-request cost, not the events, is what a server spends. */
#define MAX_BATCH_JOBS 1024

/* Append one reply entry (i: its index; res_e stolen, NULL on ENOMEM). */
static void batch_entry_append(gp_buf *out, size_t i, json_t *res_e)
{
    char *t = res_e ? gp_json_dumps(res_e) : NULL;
    json_decref(res_e);
    if (i > 0)
        gp_buf_append(out, ",", 1);
    if (t)
        gp_buf_append(out, t, strlen(t));
    else
        gp_buf_append(out, "null", 4);
    free(t);
}

/* Append {"job_id":jid,"status":200,"cancel":b}, what json_pack wrote. */
static void batch_ok_append(gp_buf *out, size_t i, const char *jid, size_t n, bool cancel)
{
    if (i > 0)
        gp_buf_append(out, ",", 1);
    static const char pre[] = "{\"job_id\":\"", yes[] = "\",\"status\":200,\"cancel\":true}",
                      no[] = "\",\"status\":200,\"cancel\":false}";
    gp_buf_append(out, pre, sizeof pre - 1);
    gps_json_escape_append(out, jid, n);
    if (cancel)
        gp_buf_append(out, yes, sizeof yes - 1);
    else
        gp_buf_append(out, no, sizeof no - 1);
}

/* The entry of an applied job: {"job_id":..,"status":200,"cancel":b} or
 * its error. */
static void batch_result_append(gp_buf *out, size_t i, const char *jid, size_t jid_len,
                                const apply_result *res)
{
    if (res->status == 200) {
        batch_ok_append(out, i, jid, jid_len, res->cancel);
        return;
    }
    json_t *res_e = json_pack("{s:s%,s:i,s:{s:s,s:s}}", "job_id", jid, jid_len, "status",
                              res->status, "error", "code", res->code, "message", res->msg);
    if (res_e && res->expected_seq >= 0)
        json_object_set_new(json_object_get(res_e, "error"), "details",
                            json_pack("{s:I}", "expected_seq", (json_int_t)res->expected_seq));
    batch_entry_append(out, i, res_e);
}

/* The hot path: a batch of the shape upload_read.h reads (token events; of
 * the liveness fields only "instance", as the agent sends it), applied
 * without a jansson tree per token. Each entry is judged and answered as
 * in the jansson path below: the reader takes only bodies every check of
 * that path accepts. Returns
 * false when the body is not of that shape (nothing was done: the caller
 * parses it with jansson), true when the request was answered. */
static bool batch_fast(gps_agents *g, gps_req *r)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    size_t n = in ? evbuffer_get_length(in) : 0;
    const char *body = n ? (const char *)evbuffer_pullup(in, -1) : NULL;
    gps_upload u;
    if (!body || !gps_upload_read(body, n, MAX_BATCH_JOBS, &u))
        return false;
    if (u.instance && !instance_ok(u.instance, u.instance_len)) {
        gps_upload_free(&u); /* the jansson path words the error */
        return false;
    }
    if (!key_allows(g, r, u.agent_id)) {
        gps_upload_free(&u);
        return true;
    }
    /* What events_liveness does with an upload whose only liveness field
     * is "instance", without an object to carry it. */
    registry_agent *ra = u.instance ? registry_get(g->reg, u.agent_id) : NULL;
    if (ra) {
        liveness lv = {.instance = u.instance};
        liveness_apply(g, ra, &lv);
    }
    gp_buf out;
    gp_buf_init(&out);
    gp_buf_append(&out, "{\"jobs\":[", 9);
    bool applied = false;
    for (size_t i = 0; i < u.n_jobs; i++) {
        const gps_upload_job *jb = &u.jobs[i];
        apply_result res;
        memset(&res, 0, sizeof res);
        res.expected_seq = -1;
        int rc = gps_jobs_apply_upload(g->jobs, jb->job_id, u.agent_id, jb->seq,
                                       u.evs + jb->first, jb->n, &res.cancel, &res.expected_seq,
                                       res.msg, sizeof res.msg);
        applied |= rc == 0;
        apply_result_set(rc, &res);
        batch_result_append(&out, i, jb->job_id, jb->job_id_len, &res);
    }
    if (applied) /* agent activity, once per upload (gps_jobs_apply_upload) */
        registry_touch(g->reg, registry_get(g->reg, u.agent_id), gp_now_mono_ms());
    count_upload(g, ROUTE_BATCH, u.n_jobs);
    gps_upload_free(&u);
    if (gp_buf_append(&out, "]}", 2) < 0)
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
    else
        gps_http_send_json_text(r->req, 200, out.data, out.len);
    gp_buf_free(&out);
    return true;
}

static void h_events_batch(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    if (batch_fast(g, r))
        return;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    const char *id = json_string_value(json_object_get(body, "agent_id"));
    json_t *jobs = json_object_get(body, "jobs");
    if (!id || !gp_uuid_valid(id)) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_REQUEST", "'agent_id' must be a UUID string",
                      "agent_id");
        return;
    }
    if (!json_is_array(jobs) || json_array_size(jobs) == 0 ||
        json_array_size(jobs) > MAX_BATCH_JOBS) {
        json_decref(body);
        char m[128];
        snprintf(m, sizeof m, "'jobs' must be an array of 1 to %d entries", MAX_BATCH_JOBS);
        gps_req_error(r, 400, "INVALID_REQUEST", m, "jobs");
        return;
    }
    if (!key_allows(g, r, id) || !events_liveness(g, r, body, id)) {
        json_decref(body);
        return;
    }
    /* The reply is rendered as text: an entry that went well (the usual
     * one) is a few appends instead of a json_pack per entry and a dump
     * (an eighth of the server's instructions per relayed token). */
    gp_buf out;
    gp_buf_init(&out);
    gp_buf_append(&out, "{\"jobs\":[", 9);
    size_t i;
    json_t *e;
    json_array_foreach(jobs, i, e)
    {
        const char *jid = json_string_value(json_object_get(e, "job_id"));
        json_t *res_e = NULL;
        if (!json_is_object(e) || !jid || json_string_length(json_object_get(e, "job_id")) == 0 ||
            json_string_length(json_object_get(e, "job_id")) > 128) {
            res_e = json_pack("{s:o,s:i,s:{s:s,s:s,s:{s:s}}}", "job_id",
                              jid ? json_string(jid) : json_null(), "status", 400, "error",
                              "code", "INVALID_REQUEST", "message",
                              "each entry must be an object with a 'job_id' string of 1 to 128 "
                              "bytes, 'seq' and 'events'",
                              "details", "param", "job_id");
            batch_entry_append(&out, i, res_e);
            continue;
        }
        /* The entry as a single upload's body, for the same checks. */
        json_t *one = json_pack("{s:s,s:O,s:O}", "agent_id", id, "seq",
                                json_object_get(e, "seq") ? json_object_get(e, "seq")
                                                          : json_null(),
                                "events",
                                json_object_get(e, "events") ? json_object_get(e, "events")
                                                             : json_null());
        char field[96], emsg[256];
        if (!one || gps_agent_events_check(one, field, sizeof field, emsg, sizeof emsg) < 0) {
            res_e = json_pack("{s:s,s:i,s:{s:s,s:s,s:{s:s}}}", "job_id", jid, "status", 400,
                              "error", "code", "INVALID_EVENT", "message",
                              one ? emsg : "out of memory", "details", "param",
                              one ? field : "");
        } else {
            apply_result res;
            apply_job_events(g, jid, id, json_object_get(one, "seq"),
                             json_object_get(one, "events"), &res);
            batch_result_append(&out, i, jid, json_string_length(json_object_get(e, "job_id")),
                                &res);
            json_decref(one);
            continue;
        }
        json_decref(one);
        batch_entry_append(&out, i, res_e);
    }
    count_upload(g, ROUTE_BATCH, json_array_size(jobs));
    json_decref(body);
    if (gp_buf_append(&out, "]}", 2) < 0)
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
    else
        gps_http_send_json_text(r->req, 200, out.data, out.len);
    gp_buf_free(&out);
}

/* ------------------------------------------------------------------ */
/* Enrollment                                                          */
/* ------------------------------------------------------------------ */

int gps_agents_enroll_parse(const json_t *body, const char **agent_id, const char **name,
                            const char **param, char *err, size_t errlen)
{
    *agent_id = NULL;
    *name = "";
    *param = NULL;
    if (!json_is_object(body)) {
        snprintf(err, errlen, "the body must be a JSON object");
        return -1;
    }
    const json_t *id = json_object_get(body, "agent_id");
    if (!json_is_string(id) || json_string_length(id) != 36 ||
        !gp_uuid_valid(json_string_value(id))) {
        *param = "agent_id";
        snprintf(err, errlen, "'agent_id' must be a UUID string (the id the agent keeps in "
                              "its state dir)");
        return -1;
    }
    const json_t *nm = json_object_get(body, "name");
    if (nm && !json_is_null(nm)) {
        const char *s = json_string_value(nm);
        size_t len = json_string_length(nm);
        *param = "name";
        if (!s) {
            snprintf(err, errlen, "'name' must be a string");
            return -1;
        }
        if (len > 256) {
            snprintf(err, errlen, "'name' must be at most 256 bytes");
            return -1;
        }
        if (len > 0 && !gps_agent_text_ok(s, len, 256)) {
            snprintf(err, errlen, "'name' must be printable text (no control characters)");
            return -1;
        }
        *param = NULL;
        *name = s;
    }
    *agent_id = json_string_value(id);
    return 0;
}

/* Stable code and message of a refused enrollment: the agent tells its
 * operator which (expired, revoked, used up, not an enrollment token). */
static const char *enroll_code(gps_auth_result res)
{
    switch (res) {
    case GPS_AUTH_MISSING: return "UNAUTHORIZED";
    case GPS_AUTH_REVOKED: return "KEY_REVOKED";
    case GPS_AUTH_EXPIRED: return "KEY_EXPIRED";
    case GPS_AUTH_WRONG_ROLE: return "WRONG_ROLE";
    case GPS_AUTH_EXHAUSTED: return "TOKEN_EXHAUSTED";
    default: return "INVALID_API_KEY";
    }
}

static const char *enroll_message(gps_auth_result res, const gps_auth_key *k)
{
    switch (res) {
    case GPS_AUTH_MISSING:
        return "missing enrollment token (Authorization: Bearer <token>)";
    case GPS_AUTH_REVOKED:
        return "this enrollment token was revoked";
    case GPS_AUTH_EXPIRED:
        return "this enrollment token has expired";
    case GPS_AUTH_WRONG_ROLE:
        /* Say which key was given: a client key here is a common mix-up. */
        switch (k ? k->role : GPS_KEY_ROLE_COUNT) {
        case GPS_KEY_CLIENT:
            return "this route needs an enrollment token; the key given is a client key";
        case GPS_KEY_ADMIN:
            return "this route needs an enrollment token; the key given is an admin key "
                   "(make a token with POST /admin/keys {\"role\":\"enrollment\"})";
        case GPS_KEY_AGENT:
            return "this route needs an enrollment token; the key given is an agent key "
                   "(an agent key is used as it is, without enrolling)";
        default:
            return "this route needs an enrollment token";
        }
    case GPS_AUTH_EXHAUSTED:
        return "this enrollment token is used up (no uses left)";
    default:
        return "unknown enrollment token";
    }
}

/* Refuse an enrollment: counted and logged like the auth hook's refusals
 * (never the token itself). */
static void enroll_refuse(gps_agents *g, gps_req *r, gps_auth_result res, const char *key_id,
                          const gps_auth_key *k)
{
    if (g->metrics) {
        char l[64];
        gps_metrics_label(l, sizeof l, "reason", gps_auth_result_name(res), (char *)NULL);
        gps_metrics_add(g->metrics, "auth_failures_total", l, 1);
    }
    gp_log_write(GP_LOG_WARN, "auth_failed", r->correlation_id,
                 json_pack("{s:s,s:s,s:s}", "reason", gps_auth_result_name(res), "key_id",
                           key_id ? key_id : "", "path", "/agents/enroll"),
                 "enrollment refused");
    gps_req_add_header(r, "x-should-retry", "false");
    gps_req_error(r, gps_auth_result_status(res), enroll_code(res), enroll_message(res, k),
                  NULL);
}

/* POST /agents/check: would this credential get an agent in? An agent asks
 * before a long model download, so that a bad key fails in a second, not
 * after hours. Public at the http layer (an enrollment token must get an
 * answer too); changes nothing: no binding, no use spent. 200 {"role":
 * "agent"|"enrollment"|null (auth off)} or the refusal enrollment gives. */
static void h_check(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    if (!g->auth || !gps_auth_enabled(g->auth)) {
        gps_http_send_json(r->req, 200, json_pack("{s:n}", "role"));
        return;
    }
    const char *cred = gps_req_header(r, "Authorization");
    const gps_auth_key *k = NULL;
    gps_auth_result res = gps_auth_check(g->auth, cred, GPS_KEY_AGENT, &k);
    if (res == GPS_AUTH_OK) {
        gps_http_send_json(r->req, 200, json_pack("{s:s}", "role", "agent"));
        return;
    }
    if (res == GPS_AUTH_WRONG_ROLE) {
        k = NULL;
        res = gps_auth_check(g->auth, cred, GPS_KEY_ENROLLMENT, &k);
        if (res == GPS_AUTH_OK && k && k->max_uses > 0 && k->uses >= k->max_uses)
            res = GPS_AUTH_EXHAUSTED;
        if (res == GPS_AUTH_OK) {
            gps_http_send_json(r->req, 200, json_pack("{s:s}", "role", "enrollment"));
            return;
        }
    }
    gps_req_add_header(r, "x-should-retry", "false");
    gps_req_error(r, gps_auth_result_status(res), enroll_code(res),
                  res == GPS_AUTH_WRONG_ROLE ? "this key is neither an agent key nor an "
                                               "enrollment token"
                                             : enroll_message(res, k),
                  NULL);
}

/* POST /agents/enroll: public route (the http layer does not check it);
 * the enrollment token is checked here so that each refusal gets its own
 * code. The credential is checked (once) before the body is read, then
 * spent by gps_auth_enroll_checked. */
static void h_enroll(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    if (!g->auth || !gps_auth_enabled(g->auth)) {
        gps_req_error(r, 409, "ENROLLMENT_NOT_NEEDED",
                      "auth is off on this server; run the agent without a token", NULL);
        return;
    }
    const char *cred = gps_req_header(r, "Authorization");
    const gps_auth_key *k = NULL;
    gps_auth_result res = gps_auth_check(g->auth, cred, GPS_KEY_ENROLLMENT, &k);
    char token_id[GPS_AUTH_ID_LEN + 1];
    snprintf(token_id, sizeof token_id, "%s", k ? k->id : "");
    if (res != GPS_AUTH_OK) {
        enroll_refuse(g, r, res, token_id, k);
        return;
    }
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    const char *agent_id, *name, *param;
    char err[160];
    if (gps_agents_enroll_parse(body, &agent_id, &name, &param, err, sizeof err) < 0) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_REQUEST", err, param);
        return;
    }
    /* An agent_id is its first key's for good: a new enrollment must not
     * adopt one (it would take over that agent's jobs and models). */
    if (gps_auth_agent_owner(g->auth, agent_id)) {
        gp_log_write(GP_LOG_WARN, "agent_id_taken", r->correlation_id,
                     json_pack("{s:s,s:s,s:s}", "agent_id", agent_id, "token_id", token_id,
                               "path", "/agents/enroll"),
                     "enrollment refused: the agent_id belongs to another key");
        json_decref(body);
        gps_req_add_header(r, "x-should-retry", "false");
        gps_req_error(r, 403, "AGENT_ID_TAKEN",
                      "this agent_id is already bound to an agent key; a new agent needs a "
                      "new agent_id (the old key must be revoked to free it)",
                      "agent_id");
        return;
    }
    char key[GPS_AUTH_KEY_LEN + 1], key_id[GPS_AUTH_ID_LEN + 1];
    /* k passed the check above; nothing ran since that could free it. */
    res = gps_auth_enroll_checked(g->auth, k, agent_id, name, key, key_id);
    if (res != GPS_AUTH_OK) {
        json_decref(body);
        enroll_refuse(g, r, res, token_id, k);
        return;
    }
    gp_log_write(GP_LOG_INFO, "agent_enrolled", r->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:s}", "agent_id", agent_id, "name", name, "key_id",
                           key_id, "token_id", token_id),
                 "agent %s enrolled", agent_id);
    json_t *reply = json_pack("{s:s,s:s,s:s}", "agent_id", agent_id, "key_id", key_id,
                              "agent_key", key);
    json_decref(body);
    /* The raw key is shown this once: keep it out of any cache. */
    gps_req_add_header(r, "Cache-Control", "no-store");
    gps_http_send_json(r->req, 200, reply);
    explicit_bzero(key, sizeof key);
}

/* ------------------------------------------------------------------ */
/* Revoked keys                                                        */
/* ------------------------------------------------------------------ */

/* End one agent's use of a revoked key: its parked long-poll is answered
 * 401 KEY_REVOKED and it is deregistered (OFFLINE), so it gets no new work
 * and the deferred failover moves its running jobs elsewhere. */
static void revoke_one(gps_agents *g, agent_ext *e, const char *key_id)
{
    e->key_id[0] = '\0';
    bool had_poll = e->parked != NULL;
    if (e->parked) {
        struct evhttp_request *req = e->parked;
        unpark(e);
        gps_http_send_error(req, GPS_DIALECT_NATIVE, 401, "KEY_REVOKED",
                            "this agent key was revoked", NULL, e->park_cid, NULL);
    }
    gp_log_write(GP_LOG_WARN, "agent_key_revoked", NULL,
                 json_pack("{s:s,s:s,s:b}", "agent_id", e->id, "key_id", key_id,
                           "parked_poll_ended", had_poll),
                 "agent %s: its key was revoked", e->id);
    registry_agent *a = g->reg ? registry_get(g->reg, e->id) : NULL;
    if (a && a->state != REGISTRY_OFFLINE && a->state != REGISTRY_DEAD)
        registry_deregister(g->reg, a, gp_now_mono_ms());
}

/* Revocation listener (auth.h). Matching agents are collected in small
 * batches first: the map must not change during a walk, and acting on an
 * agent clears its key id, so the next walk does not find it again. */
static void on_key_revoked(void *arg, const char *key_id)
{
    gps_agents *g = arg;
    if (!key_id || !*key_id)
        return;
    for (;;) {
        agent_ext *hit[32];
        size_t n = 0, i;
        for (smap_node *nd = smap_first(&g->ext, &i); nd && n < 32; nd = smap_next(&g->ext, nd, &i)) {
            agent_ext *e = nd->val;
            if (strcmp(e->key_id, key_id) == 0)
                hit[n++] = e;
        }
        if (n == 0)
            break;
        for (size_t k = 0; k < n; k++)
            revoke_one(g, hit[k], key_id);
    }
}

/* ------------------------------------------------------------------ */
/* Lifecycle                                                           */
/* ------------------------------------------------------------------ */

gps_agents *gps_agents_new(struct event_base *base, const gps_agents_opts *opts,
                           struct gps_store *store, gps_metrics *metrics)
{
    gps_agents *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->base = base;
    g->opts = *opts;
    if (g->opts.disconnect_grace_ms <= 0)
        g->opts.disconnect_grace_ms = 1000;
    g->store = store;
    g->metrics = metrics;
    gp_random_hex(g->epoch, 8);
    return g;
}

void gps_agents_set_deploy(gps_agents *g, gps_deploy *deploy)
{
    g->deploy = deploy;
}

void gps_agents_set_pins(gps_agents *g, gps_pins *pins)
{
    g->pins = pins;
}

void gps_agents_set_auth(gps_agents *g, struct gps_auth *auth)
{
    if (g->auth && g->auth != auth)
        gps_auth_set_revoke_listener(g->auth, NULL, NULL);
    g->auth = auth;
    if (auth)
        gps_auth_set_revoke_listener(auth, on_key_revoked, g);
}

int gps_agents_attach(gps_agents *g, registry *reg, sched *s, gps_jobs *jobs)
{
    g->reg = reg;
    g->sched = s;
    g->jobs = jobs;
    gps_jobs_set_deliver(jobs, deliver_cb, g);
    if (!g->base)
        return 0;
    g->deferred = event_new(g->base, -1, 0, deferred_cb, g);
    g->tick = event_new(g->base, -1, EV_PERSIST, tick_cb, g);
    /* 250 ms: state changes (suspect, dead) are noticed within a quarter
     * second of their deadline; a tick is O(transitions). */
    struct timeval tv = {0, 250000};
    if (!g->deferred || !g->tick || event_add(g->tick, &tv) < 0)
        return -1;
    return 0;
}

static void release_one(void *ud, registry_agent *a)
{
    gps_agents *g = ud;
    agent_ext *e = ext_get(g, a->id, false);
    if (e && e->parked) {
        struct evhttp_request *req = e->parked;
        unpark(e);
        reply_204(req);
    }
}

void gps_agents_release_all(gps_agents *g)
{
    if (g->reg)
        registry_foreach(g->reg, release_one, g);
}

static void free_ext(void *v)
{
    agent_ext *e = v;
    if (e->timer)
        event_free(e->timer);
    if (e->grace)
        event_free(e->grace);
    gps_held_release(&e->held);
    free(e);
}

void gps_agents_free(gps_agents *g)
{
    if (!g)
        return;
    if (g->tick)
        event_free(g->tick);
    if (g->deferred)
        event_free(g->deferred);
    if (g->auth) /* the auth object outlives us (main frees it after) */
        gps_auth_set_revoke_listener(g->auth, NULL, NULL);
    smap_free(&g->ext, free_ext);
    free(g);
}

int gps_agents_register(gps_http *h, gps_agents *g)
{
    int rc = 0;
    /* Public at the http layer: h_enroll checks the enrollment token. */
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/enroll", GPS_DIALECT_NATIVE,
                             GPS_ROLE_NONE, h_enroll, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/poll", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, h_poll, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/work", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, h_work, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/jobs/{id}/events",
                             GPS_DIALECT_NATIVE, GPS_ROLE_AGENT, h_events, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/events", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, h_events_batch, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/deregister", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, h_deregister, g);
    /* Public at the http layer: h_check answers for any credential. */
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/check", GPS_DIALECT_NATIVE,
                             GPS_ROLE_NONE, h_check, g);
    return rc ? -1 : 0;
}

/* GPU gauges of one live agent (hw_facts.h), only the figures it knows. */
static void collect_gpus(gps_metrics *m, const registry_agent *a)
{
    for (int i = 0; i < a->hw.n_gpus; i++) {
        const hw_gpu *g = &a->hw.gpus[i];
        char idx[16], l[700]; /* id, a 256-byte name with every byte escaped, index */
        snprintf(idx, sizeof idx, "%d", g->index);
        gps_metrics_label(l, sizeof l, "agent", a->id, "name", a->name ? a->name : "", "gpu",
                          idx, (char *)NULL);
        if (g->vram_total >= 0)
            gps_metrics_set(m, "gpu_vram_total_bytes", l, (double)g->vram_total);
        if (g->vram_used >= 0)
            gps_metrics_set(m, "gpu_vram_used_bytes", l, (double)g->vram_used);
        if (g->vram_model >= 0)
            gps_metrics_set(m, "gpu_vram_model_bytes", l, (double)g->vram_model);
        if (g->vram_free >= 0)
            gps_metrics_set(m, "gpu_vram_free_bytes", l, (double)g->vram_free);
        if (g->utilization >= 0)
            gps_metrics_set(m, "gpu_utilization_ratio", l, g->utilization);
        if (g->temperature > -1000)
            gps_metrics_set(m, "gpu_temperature_celsius", l, g->temperature);
        if (g->power_w >= 0)
            gps_metrics_set(m, "gpu_power_watts", l, g->power_w);
        if (g->in_use)
            gps_metrics_set(m, "gpu_fault", l, g->fault ? 1 : 0);
    }
}

/* Backend, agent error and device faults of one live agent. */
static void collect_backend(gps_metrics *m, const registry_agent *a, const char *l)
{
    if (a->hw.backend[0]) {
        char lb[800];
        gps_metrics_label(lb, sizeof lb, "agent", a->id, "name", a->name ? a->name : "",
                          "backend", a->hw.backend, (char *)NULL);
        gps_metrics_set(m, "agent_backend", lb, 1);
    }
    gps_metrics_set(m, "agent_error", l, a->hw.error_code[0] ? 1 : 0);
    if (a->hw.faults >= 0)
        gps_metrics_set(m, "agent_backend_faults_total", l, (double)a->hw.faults);
    collect_gpus(m, a);
}

typedef struct collect_ctx {
    gps_metrics *m;
    size_t per_state[REGISTRY_STATE_COUNT];
    long long busy, total;
} collect_ctx;

static void collect_one(void *ud, registry_agent *a)
{
    collect_ctx *c = ud;
    c->per_state[a->state]++;
    if (registry_agent_has_slots(a)) {
        c->total += a->slots_total;
        c->busy += registry_agent_slots_busy(a);
        /* Per live agent: bounded by the fleet, gone when the agent is.
         * The name is for people (dashboards' legends); the id stays the
         * series' identity. */
        char l[700]; /* a 256-byte name, every byte escaped */
        gps_metrics_label(l, sizeof l, "agent", a->id, "name", a->name ? a->name : "",
                          (char *)NULL);
        gps_metrics_set(c->m, "agent_queue_depth", l, (double)a->queue_depth);
        if (json_is_number(json_object_get(a->facts, "kv_cache_utilization")))
            gps_metrics_set(c->m, "agent_kv_cache_utilization", l, a->kv_cache_utilization);
        if (a->prefix.reported) {
            long long held = 0;
            for (size_t i = 0; i < a->prefix.n_slots; i++)
                held += a->prefix.slots[i].tokens;
            gps_metrics_set(c->m, "agent_prefix_cache_lookups_total", l,
                            (double)a->prefix.lookups);
            gps_metrics_set(c->m, "agent_prefix_cache_hits_total", l, (double)a->prefix.hits);
            gps_metrics_set(c->m, "agent_prefix_cache_tokens_saved_total", l,
                            (double)a->prefix.tokens_saved);
            gps_metrics_set(c->m, "agent_prefix_cache_tokens_computed_total", l,
                            (double)a->prefix.tokens_computed);
            gps_metrics_set(c->m, "agent_prefix_cache_tokens_held", l, (double)held);
        }
        collect_backend(c->m, a, l);
    }
}

typedef struct model_probe {
    const char *name;
    bool listed;
} model_probe;

static void probe_one(void *ud, registry_agent *a)
{
    model_probe *p = ud;
    if (!p->listed && registry_agent_serves(a, p->name))
        p->listed = true;
}

/* A model with no live agent is shown (0, GpupoolNoAgentForModel) while a
 * known agent, in any state, still lists it: one that died or stopped.
 * A name no agent lists any more (renamed, agent removed) is dropped, or
 * its 0 would page until a restart. */
static void collect_model(void *ud, const char *name, size_t live_agents)
{
    gps_agents *g = ud;
    if (live_agents == 0) {
        model_probe p = {name, false};
        registry_foreach(g->reg, probe_one, &p);
        if (!p.listed)
            return;
    }
    char l[600]; /* a 256-byte name, every byte escaped */
    gps_metrics_label(l, sizeof l, "model", name, (char *)NULL);
    gps_metrics_set(g->collect_m, "model_agents", l, (double)live_agents);
}

void gps_agents_collect(gps_agents *g, gps_metrics *m)
{
    collect_ctx c;
    memset(&c, 0, sizeof c);
    c.m = m;
    gps_metrics_reset(m, "agent_queue_depth");
    gps_metrics_reset(m, "agent_kv_cache_utilization");
    gps_metrics_reset(m, "agent_prefix_cache_lookups_total");
    gps_metrics_reset(m, "agent_prefix_cache_hits_total");
    gps_metrics_reset(m, "agent_prefix_cache_tokens_saved_total");
    gps_metrics_reset(m, "agent_prefix_cache_tokens_computed_total");
    gps_metrics_reset(m, "agent_prefix_cache_tokens_held");
    static const char *const hw_families[] = {
        "agent_backend", "agent_error", "agent_backend_faults_total", "gpu_vram_total_bytes",
        "gpu_vram_used_bytes", "gpu_vram_model_bytes", "gpu_vram_free_bytes",
        "gpu_utilization_ratio", "gpu_temperature_celsius", "gpu_power_watts", "gpu_fault",
        "model_agents",
    };
    for (size_t i = 0; i < sizeof hw_families / sizeof hw_families[0]; i++)
        gps_metrics_reset(m, hw_families[i]);
    if (g->reg) {
        registry_foreach(g->reg, collect_one, &c);
        g->collect_m = m;
        registry_models_foreach(g->reg, collect_model, g);
    }
    for (int s = 0; s < REGISTRY_STATE_COUNT; s++) {
        char l[64];
        gps_metrics_label(l, sizeof l, "state", registry_state_name((registry_state)s),
                          (char *)NULL);
        gps_metrics_set(m, "agents", l, (double)c.per_state[s]);
    }
    gps_metrics_set(m, "agents_parked", NULL, (double)g->nparked);
    gps_metrics_set(m, "agents_liveness_parked", NULL, (double)g->nliveness);
    gps_metrics_set(m, "slots_busy", NULL, (double)c.busy);
    gps_metrics_set(m, "slots_capacity", NULL, (double)c.total);
}

size_t gps_agents_parked(const gps_agents *g)
{
    return g->nparked;
}
