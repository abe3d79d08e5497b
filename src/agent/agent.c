/* agent: the agent's lifecycle (agent_create, agent_stop, agent_destroy); see agent_internal.h. */
#include "agent/agent_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_facts.h"

/* ======================================================================== */
/* Lifecycle                                                                */
/* ======================================================================== */

void ag_init(agent *a, const agent_options *o, agent_backend *backend)
{
    a->o = o;
    a->be = backend;
    a->wake_fd = -1;
    atomic_init(&a->looping, false);
    pthread_mutex_init(&a->mu, NULL);
    atomic_init(&a->stop_req, 0);
    atomic_init(&a->wake_sent, false);
    a->lazy_srv = -1;
    a->lazy_urgent_srv = -1;
    agent_timers_init(&a->deadlines);
    agent_timers_init(&a->retries);
    agent_idtab_init(&a->jtab);
    gp_buf_init(&a->live_ids);
    a->live_dirty = true;
    a->poll_interval_ms = 15000;
    a->work_wait_ms = 25000;
    agent_backoff_init(&a->backoff, 500, 30000);
}

agent *agent_create(const agent_options *o, agent_backend *backend, char *err, size_t errlen)
{
    char *key = NULL; /* from DIR/agent.key */
    agent *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        if (backend)
            backend->ops->destroy(backend);
        return NULL;
    }
    ag_init(a, o, backend);

    if (agent_state_load_id(o->state_dir, a->id, err, errlen) < 0)
        goto fail;
    gp_random_hex(a->instance, 16);
    a->labels = agent_labels_parse(o->labels, err, errlen);
    if (!a->labels)
        goto fail;
    a->n_servers = agent_servers_parse(o->server, &a->servers, err, errlen);
    if (a->n_servers < 0) {
        a->n_servers = 0;
        goto fail;
    }
    a->base = a->servers[0];
    a->uh = calloc((size_t)a->n_servers * 2, sizeof *a->uh); /* NULL: URLs as text */
    a->proxy_env = ag_proxy_env_set();
    if (o->name && *o->name) {
        a->name = strdup(o->name);
    } else {
        char host[256] = "agent";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        a->name = strdup(host);
    }
    /* Our own key from an earlier enrollment wins over --token; without
     * one, --token is an enrollment token to trade first (or, refused as
     * not being one, the agent key itself). */
    int kr = agent_state_load_key(o->state_dir, &key, err, errlen);
    if (kr < 0)
        goto fail;
    bool have_token = o->token && *o->token;
    a->key_from_file = kr == 1;
    a->token_ignored = kr == 1 && have_token;
    a->enrolling = kr == 0 && have_token;
    int hk = ag_set_key(a, kr == 1 ? key : o->token);
    a->static_facts = agent_facts_static();
    a->multi = curl_multi_init();
    if (!a->name || !a->multi || !a->static_facts || hk < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    /* Several requests (long-poll, heartbeat, uploads) share a few reused
     * connections to the server(s). */
    int total, usable;
    ag_slot_counts(a, &total, &usable);
    curl_multi_setopt(a->multi, CURLMOPT_MAXCONNECTS, (long)(total + 4));
    if (ag_loop_init(a, err, errlen) != 0)
        goto fail;
    free(key);
    return a;
fail:
    free(key);
    agent_destroy(a);
    return NULL;
}

void agent_stop(agent *a, bool hard)
{
    int want = hard ? 2 : 1;
    int cur = atomic_load(&a->stop_req);
    while (cur < want && !atomic_compare_exchange_weak(&a->stop_req, &cur, want)) {
    }
    if (a->wake_fd >= 0)
        ag_loop_wake_fd(a);
}

const char *agent_id(const agent *a)
{
    return a->id;
}

void agent_destroy(agent *a)
{
    if (!a)
        return;
    /* Backend first: it joins its threads, so no sink call can follow. */
    if (a->be)
        a->be->ops->destroy(a->be);
    a->be = NULL;
    if (a->multi) {
        ag_req_abort(a, a->enroll_req);
        ag_req_abort(a, a->poll_req);
        ag_req_abort(a, a->work_req);
        ag_req_abort(a, a->work_stale);
        ag_req_abort(a, a->dereg_req);
        /* A batched upload is shared by its jobs (there may be two: one
         * left with an old server by server_switch): abort each once. */
        for (agent_job *j = a->jobs; j; j = j->next) {
            req *u = j->upload;
            for (agent_job *k = j; u && k; k = k->next)
                if (k->upload == u)
                    k->upload = NULL;
            ag_req_abort(a, u);
        }
        a->batch_req = a->urgent_req = NULL;
    }
    agent_timers_free(&a->deadlines); /* before the jobs: it touches their nodes */
    agent_timers_free(&a->retries);
    while (a->jobs) {
        agent_job *j = a->jobs;
        a->jobs = j->next;
        ag_job_free(j);
    }
    while (a->n_easy_idle > 0)
        curl_easy_cleanup(a->easy_idle[--a->n_easy_idle]);
    if (a->multi)
        curl_multi_cleanup(a->multi); /* its socket events freed (on_req_socket) */
    /* The loop last: the backend's events and the requests' were on it. */
    if (a->turn_ev)
        event_free(a->turn_ev);
    if (a->wake_ev)
        event_free(a->wake_ev);
    if (a->curl_tev)
        event_free(a->curl_tev);
    if (a->evb)
        event_base_free(a->evb);
    if (a->wake_fd >= 0)
        close(a->wake_fd);
    free(a->review);
    agent_idtab_free(&a->jtab);
    gp_buf_free(&a->live_ids);
    json_decref(a->labels);
    json_decref(a->static_facts);
    for (int i = 0; a->uh && i < a->n_servers * 2; i++)
        curl_url_cleanup(a->uh[i]);
    free(a->uh);
    curl_slist_free_all(a->hdrs);
    for (size_t i = 0; i < a->n_hdrs_old; i++)
        curl_slist_free_all(a->hdrs_old[i]);
    free(a->hdrs_old);
    agent_servers_free(a->servers, a->n_servers);
    free(a->name);
    free(a->auth_header);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
