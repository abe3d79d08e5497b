/*
 * agents_api: the agents' protocol (contract in agents_api.h): parked
 * long-polls, /agents/poll, /agents/work and deregistration, revoked agent
 * keys, and the module's lifecycle.
 *
 * The module's files (what they share is in agents_api_priv.h, private to
 * them):
 *   - agents_api.c (this file): long-polls, the poll and work handlers,
 *     revoked keys, new/free/register;
 *   - agents_api_live.c: liveness (a closed long-poll, a restarted agent,
 *     its own job list), registry transitions, agents persisted;
 *   - agents_api_events.c: the agents' event uploads, one job or a batch;
 *   - agents_api_enroll.c: /agents/enroll and /agents/check.
 */
#include "server/agents_api_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
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

agent_ext *agents_ext_get(gps_agents *g, const char *id, bool create)
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
void agents_unpark(agent_ext *e)
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

/* Hand jobs (wire objects) to an agent. The reply carries a delivery token
 * "<epoch>.<n>" the agent echoes as `delivery_seen` once it has read it; the
 * jobs remember n (gps_jobs_agent_report). The epoch keeps a restarted
 * server from reading an older process's numbers. */
/* The work reply: {"jobs":[...],"delivery":"EPOCH.N"}, written around the
 * jobs' wire text (gps_jobs_hand_out's: the bytes the jansson reply
 * dumped). delivery is n, which the jobs carry once it went out. */
int agents_reply_jobs(gps_agents *g, agent_ext *e, struct evhttp_request *req,
                      const gp_buf *jobs, uint64_t n)
{
    char tok[48];
    snprintf(tok, sizeof tok, "%s.%llu", g->epoch, (unsigned long long)n);
    gp_buf body;
    gp_buf_init(&body);
    int rc = -1;
    if (!jobs || gp_buf_append(&body, "{\"jobs\":", 8) < 0 ||
        gp_buf_append(&body, jobs->data, jobs->len) < 0 ||
        gp_buf_append(&body, ",\"delivery\":\"", 13) < 0 ||
        gp_json_escape_append(&body, tok, strlen(tok)) < 0 ||
        gp_buf_append(&body, "\"}", 2) < 0)
        gps_http_send_error(req, GPS_DIALECT_NATIVE, 500, "INTERNAL", "out of memory", NULL,
                            NULL, NULL);
    else
        rc = gps_http_send_json_text(req, 200, body.data, body.len);
    gp_buf_free(&body);
    agents_await_repark(g, e);
    return rc;
}

void agents_reply_204(struct evhttp_request *req)
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
    agents_unpark(e);
    agents_reply_204(req);
    agents_await_repark(e->g, e);
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
bool agents_key_allows(gps_agents *g, gps_req *r, const char *agent_id)
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
        /* Its message for want of memory is exactly this one: the
         * server's failure, not the agent's body. */
        if (strcmp(err, "out of memory") == 0)
            gps_req_error(r, 500, "INTERNAL", err, NULL);
        else
            gps_req_error(r, 400, "INVALID_REQUEST", err, NULL);
        return;
    }
    liveness lv;
    if (!agents_key_allows(g, r, f.agent_id) || !agents_liveness_parse(g, r, body, &lv)) {
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
    agents_liveness_apply(g, a, &lv);
    /* Its list lost names (registry.h, models_before): their queued jobs
     * may move to a fallback, from the deferred event like a drain's. A
     * poll that changed nothing costs this test alone. */
    if (a->models_before && g->deferred)
        event_active(g->deferred, EV_TIMEOUT, 0);
    /* What the agent must hold (deploy.h): only for agents that take
     * deployments; older agents never see the member. */
    json_t *deployments = NULL;
    bool deploy_ok = !g->deploy || gps_deploy_agent_poll(g->deploy, a, body, gp_now_mono_ms(),
                                                         gp_now_wall_ms(), &deployments) == 0;
    json_decref(body); /* lv pointed into it */
    sched_agent_update(g->sched, a);
    agent_ext *e = agents_ext_get(g, a->id, true);
    if (e) {
        snprintf(e->key_id, sizeof e->key_id, "%s", r->key_id);
        agents_persist_agent(g, a, e, r->key_id);
        agents_dispatch_parked(g, e);
    }
    json_t *commands = gps_jobs_pending_cancels(g->jobs, a->id);
    /* The reply is whole or a 500 (out of memory): an agent told nothing
     * of a cancel, a drain or a deployment would go on as if there were
     * none (a deployment left out of its list, it unloads); on a 500 it
     * keeps what it holds and polls again. */
    bool whole = commands != NULL && deploy_ok;
    if (commands && a->admin_drain)
        whole &= json_array_append_new(commands, json_pack("{s:s}", "type", "drain")) == 0;
    /* features: what this server takes beyond the first protocol, so that
     * a newer agent uses it only here (events_batch: POST /agents/events). */
    json_t *reply = json_pack("{s:s,s:s,s:i,s:i,s:O,s:[s]}", "agent_id", a->id, "state",
                              registry_state_name(a->state), "poll_interval_sec",
                              g->opts.poll_interval_sec, "work_wait_sec", g->opts.work_wait_sec,
                              "commands", commands, "features", "events_batch");
    /* Tell the agent, so that its own log says why a model gets no work. */
    if (reply && refused) /* (for the agent's log only: best effort) */
        json_object_set(reply, "refused_models", gps_pins_refused(g->pins, a->id));
    if (reply && deployments)
        whole &= json_object_set(reply, "deployments", deployments) == 0;
    json_decref(deployments);
    if (!whole) {
        json_decref(reply);
        reply = NULL;
    }
    /* A cancel is forgotten only once a reply that carries it is written:
     * the 500 leaves it for the next poll (else the agent would go on
     * generating for a client that left). */
    if (gps_http_send_json(r->req, 200, reply) == 0)
        gps_jobs_cancels_sent(g->jobs, a->id, commands);
    json_decref(commands);
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
    if (!id || !agents_key_allows(g, r, id)) {
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
        agent_ext *e = agents_ext_get(g, id, false);
        if (e && e->parked) {
            struct evhttp_request *req = e->parked;
            agents_unpark(e);
            agents_reply_204(req);
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

/* A work request that finds jobs is answered at once (gps_jobs_hand_out's
 * reply): -1 when a 500 went instead, and the jobs go back to their queues. */
typedef struct work_reply {
    gps_agents *g;
    agent_ext *e;
    struct evhttp_request *req;
} work_reply;

static long long reply_now(registry_agent *a, const gp_buf *jobs, void *arg)
{
    work_reply *w = arg;
    (void)a;
    uint64_t n = ++w->g->deliveries;
    return agents_reply_jobs(w->g, w->e, w->req, jobs, n) == 0 ? (long long)n : -1;
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
    if (!id || !agents_key_allows(g, r, id)) {
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
    if (!agents_liveness_parse(g, r, body, &lv)) {
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
    agent_ext *e = agents_ext_get(g, a->id, true);
    if (!e) {
        json_decref(body);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    /* A new long-poll: the process is alive (a closed one's grace ends). */
    gps_agents_poll_reopened(g, a->id);
    agents_liveness_apply(g, a, &lv);
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
        agents_unpark(e);
        agents_reply_204(old);
    }
    /* free_slots 0: a busy agent's liveness channel; parked, never given
     * jobs. Answered now (jobs, or 500 with the jobs back in their
     * queues): done. */
    work_reply w = {g, e, r->req};
    if (free_slots > 0 && gps_jobs_hand_out(g->jobs, a, free_slots, reply_now, &w) != 0)
        return;
    /* Park. The agent stays ready in the scheduler (gps_jobs_hand_out made it
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
    gps_held_start(&e->held, r->req, true, g->opts.work_wait_sec + 30, agents_park_gone, e);
    e->timer = evtimer_new(g->base, park_timeout_cb, e);
    struct timeval tv = {g->opts.work_wait_sec, 0};
    if (e->timer)
        evtimer_add(e->timer, &tv);
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
        agents_unpark(e);
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
    gps_jobs_set_deliver(jobs, agents_deliver_cb, g);
    if (!g->base)
        return 0;
    g->deferred = event_new(g->base, -1, 0, agents_deferred_cb, g);
    g->tick = event_new(g->base, -1, EV_PERSIST, agents_tick_cb, g);
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
    agent_ext *e = agents_ext_get(g, a->id, false);
    if (e && e->parked) {
        struct evhttp_request *req = e->parked;
        agents_unpark(e);
        agents_reply_204(req);
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
    /* Public at the http layer: agents_h_enroll checks the enrollment token. */
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/enroll", GPS_DIALECT_NATIVE,
                             GPS_ROLE_NONE, agents_h_enroll, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/poll", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, h_poll, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/work", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, h_work, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/jobs/{id}/events",
                             GPS_DIALECT_NATIVE, GPS_ROLE_AGENT, agents_h_events, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/events", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, agents_h_events_batch, g);
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/deregister", GPS_DIALECT_NATIVE,
                             GPS_ROLE_AGENT, h_deregister, g);
    /* Public at the http layer: agents_h_check answers for any credential. */
    rc |= gps_http_add_route(h, EVHTTP_REQ_POST, "/agents/check", GPS_DIALECT_NATIVE,
                             GPS_ROLE_NONE, agents_h_check, g);
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
