/* agent_server: requests to the server (libcurl), /agents/poll and /agents/enroll. */
#include "agent/agent_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_facts.h"
#include "common/gp_json.h"
#include "common/gp_log.h"

/* ======================================================================== */
/* Requests to the server                                                   */
/* ======================================================================== */

static size_t req_write_cb(char *p, size_t sz, size_t nm, void *ud)
{
    req *r = ud;
    size_t n = sz * nm;
    if (r->resp.len + n > MAX_RESPONSE_BYTES) {
        r->too_big = true;
        return 0; /* abort the transfer */
    }
    if (gp_buf_append(&r->resp, p, n) < 0)
        return 0;
    return n;
}

static void req_free(req *r)
{
    if (!r)
        return;
    free(r->batch);
    free(r->body);
    if (r->easy)
        curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->hdrs);
    gp_buf_free(&r->resp);
    free(r);
}

/* An easy handle with what every request sets alike: a finished request's
 * (kept as it was: issue 24, curl_easy_reset and setting everything again
 * cost ~3,000 instructions a request) or a new one. */
static CURL *easy_take(agent *a)
{
    if (a->n_easy_idle)
        return a->easy_idle[--a->n_easy_idle];
    CURL *e = curl_easy_init();
    if (!e)
        return NULL;
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, req_write_cb);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    if (!a->proxy_env) {
        /* What libcurl concludes from an environment without proxy
         * variables, said once: it read five of them per request. */
        curl_easy_setopt(e, CURLOPT_PROXY, "");
        curl_easy_setopt(e, CURLOPT_NOPROXY, "");
    }
    /* https:// servers are verified (chain and host name) unless the
     * operator explicitly opted out (agent_config refuses --insecure
     * without its confirmation flag). */
    if (a->o->ca_file)
        curl_easy_setopt(e, CURLOPT_CAINFO, a->o->ca_file);
    if (a->o->insecure) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    } else {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
    }
    return e;
}

/* Whether the environment names a proxy for libcurl (the variables it
 * reads for http:// and https:// URLs, and no_proxy). */
bool ag_proxy_env_set(void)
{
    static const char *const vars[] = {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
                                       "all_proxy",  "ALL_PROXY",  "no_proxy",    "NO_PROXY"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

/* servers[srv]+path parsed once, for the paths every relayed request
 * posts to (issue 24: libcurl parsed each request's URL again, ~5,000
 * instructions); NULL for others, or when it cannot be made (then the
 * request gives libcurl the URL text as before). */
static CURLU *server_url(agent *a, int srv, req_kind kind, const char *url)
{
    if ((kind != REQ_WORK && kind != REQ_EVENTS_BATCH) || !a->uh)
        return NULL;
    CURLU **u = &a->uh[srv * 2 + (kind == REQ_WORK ? 0 : 1)];
    if (!*u && (*u = curl_url()) &&
        curl_url_set(*u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) !=
            CURLUE_OK) {
        curl_url_cleanup(*u);
        *u = NULL;
    }
    return *u;
}

/* Start POST servers[srv]+path with the body text (len bytes; taken: the
 * request owns it from here on, also on failure, and libcurl reads it in
 * place rather than copy it). Returns the request or NULL (logged). */
req *ag_req_start_text(agent *a, int srv, req_kind kind, const char *path, char *text,
                           size_t len, long timeout_ms, const char *correlation_id)
{
    req *r = calloc(1, sizeof *r);
    if (!r || !text)
        goto fail;
    r->body = text;
    text = NULL;
    r->kind = kind;
    r->srv = srv;
    gp_buf_init(&r->resp);
    r->easy = easy_take(a);
    if (!r->easy || !a->hdrs)
        goto fail;
    char url[2048];
    if ((size_t)snprintf(url, sizeof url, "%s%s", a->servers[srv], path) >= sizeof url)
        goto fail;
    if (correlation_id && *correlation_id && strlen(correlation_id) < 200 &&
        !strpbrk(correlation_id, "\r\n")) {
        /* Its own list: the shared one and X-Correlation-Id. */
        for (struct curl_slist *h = a->hdrs; h; h = h->next)
            if (!(r->hdrs = curl_slist_append(r->hdrs, h->data)))
                goto fail;
        char h[256];
        snprintf(h, sizeof h, "X-Correlation-Id: %s", correlation_id);
        struct curl_slist *l = curl_slist_append(r->hdrs, h);
        if (!l)
            goto fail;
        r->hdrs = l;
    }
    CURLU *uh = server_url(a, srv, kind, url);
    curl_easy_setopt(r->easy, CURLOPT_CURLU, uh);
    if (!uh)
        curl_easy_setopt(r->easy, CURLOPT_URL, url);
    curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->hdrs ? r->hdrs : a->hdrs);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, r->errbuf);
    /* Named on the rare requests only (poll, enrollment, deregistration):
     * the server reads no User-Agent, and libcurl formats each byte of it
     * into every long-poll and upload. */
    curl_easy_setopt(r->easy, CURLOPT_USERAGENT,
                     kind == REQ_WORK || kind == REQ_EVENTS || kind == REQ_EVENTS_BATCH
                         ? NULL
                         : "gpupool-agent/" AGENT_VERSION);
    a->kick = true; /* ag_loop_turn drives it before the loop sleeps */
    if (curl_multi_add_handle(a->multi, r->easy) != CURLM_OK)
        goto fail;
    return r;
fail:
    gp_log_error("request_failed", "cannot start a request to %s", path);
    free(text);
    req_free(r);
    return NULL;
}

/* Start POST servers[srv]+path with body (reference stolen). */
static req *req_start_at(agent *a, int srv, req_kind kind, const char *path, json_t *body,
                         long timeout_ms, const char *correlation_id)
{
    char *text = body ? gp_json_dumps(body) : NULL;
    json_decref(body);
    return ag_req_start_text(a, srv, kind, path, text, text ? strlen(text) : 0, timeout_ms,
                          correlation_id);
}

/* A request to the server polled now. */
req *ag_req_start(agent *a, req_kind kind, const char *path, json_t *body, long timeout_ms,
                      const char *correlation_id)
{
    return req_start_at(a, a->cur, kind, path, body, timeout_ms, correlation_id);
}

/* Free a finished request (removed from the multi handle), keeping its
 * easy handle for the next request (ag_req_start_text sets again every option
 * that differs between requests). */
void ag_req_done_free(agent *a, req *r)
{
    if (r->easy && a->n_easy_idle < EASY_IDLE_MAX) {
        curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, NULL); /* r->errbuf goes */
        a->easy_idle[a->n_easy_idle++] = r->easy;
        r->easy = NULL;
    }
    req_free(r);
}

/* Abort a request in flight (its completion handler will not run). */
void ag_req_abort(agent *a, req *r)
{
    if (!r)
        return;
    curl_multi_remove_handle(a->multi, r->easy);
    req_free(r);
}

/* ======================================================================== */
/* /agents/poll                                                             */
/* ======================================================================== */

/* What the server needs to know this process and the jobs it holds
 * (docs/protocol.md "Liveness"): instance, every job not yet reaped
 * (running, or finished with events still to deliver), and the last work
 * reply read before the list was made. 0, or -1 when memory ran out: a
 * list with a job left out would have the server end that job's attempt
 * (agent_dropped_job) while it still runs here, so the caller sends
 * nothing rather than a short list. */
static int add_liveness(agent *a, json_t *body)
{
    if (json_object_set_new(body, "instance", json_string(a->instance)) < 0)
        return -1;
    json_t *ids = json_array();
    /* An id passed job_id_ok (ASCII): no UTF-8 check needed, one a running
     * job in every long-poll (issue 24). */
    for (agent_job *j = a->jobs; j && ids; j = j->next)
        if (j->srv == a->cur && /* another server's jobs mean nothing here */
            json_array_append_new(ids, json_string_nocheck(j->id)) < 0) {
            json_decref(ids);
            ids = NULL;
        }
    if (json_object_set_new(body, "running_jobs", ids) < 0)
        return -1;
    if (a->delivery_seen[0] &&
        json_object_set_new(body, "delivery_seen", json_string(a->delivery_seen)) < 0)
        return -1;
    return 0;
}

/* The heartbeat's body, whole or NULL: every member a lack of memory cut
 * short or left out (static facts, gpus, the backend's facts, a running
 * job) would tell the server less than the truth, so there is no poll
 * then, the next one in a second (ag_poll_start). */
json_t *ag_poll_body(agent *a)
{
    int busy = ag_busy_slots(a), total, usable;
    ag_slot_counts(a, &total, &usable);
    /* json_pack refuses a NULL "o": models() is whole or NULL (backend.h). */
    json_t *b = json_pack("{s:s,s:s,s:s,s:o,s:{s:I,s:i},s:i,s:O,s:s}", "agent_id", a->id,
                          "name", a->name, "version", AGENT_VERSION, "models",
                          a->be->ops->models(a->be), "slots", "total",
                          (json_int_t)total, "busy", busy, "queue_depth", 0, "labels",
                          a->labels, "status", a->draining ? "draining" : "online");
    if (!b)
        return NULL;
    /* gpus: [] on a host without NVML, NULL only when memory ran out. The
     * backend in use (docs/protocol.md "Backend and GPUs"): the gguf
     * backend says cuda or cpu in its poll_facts. */
    if (json_object_update(b, a->static_facts) < 0 ||
        json_object_set_new(b, "gpus", agent_facts_gpus()) < 0 ||
        json_object_set_new(b, "backend", json_string(a->be->ops->name)) < 0)
        goto fail;
    /* Facts cut short would say a deployment dropped, a model unloaded. */
    if (a->be->ops->poll_facts && a->be->ops->poll_facts(a->be, b) < 0)
        goto fail;
    if (add_liveness(a, b) < 0)
        goto fail;
    return b;
fail:
    json_decref(b);
    return NULL;
}

void ag_poll_start(agent *a)
{
    json_t *body = ag_poll_body(a);
    a->poll_req = body ? ag_req_start(a, REQ_POLL, "/agents/poll", body,
                                   (long)a->o->request_timeout_sec * 1000, NULL)
                       : NULL;
    if (!a->poll_req)
        a->next_poll_ms = gp_now_mono_ms() + 1000;
}

/* Leave the server polled now for the next one of the list (docs/agent.md
 * "Several servers"). Its poll, long-poll and enrollment in flight are
 * aborted (the server failed them, or will); the uploads of the jobs it
 * assigned stay with it, as after a restart of the only server. What the
 * server told us about itself is forgotten until the next one says it.
 * quiet: a move within an outage of the whole list (logged at debug). */
static void server_switch(agent *a, const char *what, const char *detail, bool quiet)
{
    int from = a->cur;
    a->cur = (a->cur + 1) % a->n_servers;
    a->base = a->servers[a->cur];
    gp_log_write(quiet ? GP_LOG_DEBUG : GP_LOG_WARN, "server_switch", NULL,
                 json_pack("{s:s,s:s,s:s,s:s}", "from", a->servers[from], "to", a->base,
                           "request", what, "reason", detail),
                 "%s failed on %s (%s); moving to %s", what, a->servers[from], detail, a->base);
    ag_req_abort(a, a->enroll_req);
    ag_req_abort(a, a->poll_req);
    ag_req_abort(a, a->work_req);
    ag_req_abort(a, a->work_stale);
    a->enroll_req = a->poll_req = a->work_req = a->work_stale = NULL;
    /* A batched upload to the old server stays its jobs' (ag_batch_done still
     * takes its answer) but must not hold back the new server's batches
     * until it times out. */
    a->batch_req = a->urgent_req = NULL;
    a->events_batch = false;   /* until the new server's poll reply announces it */
    a->no_liveness = false;
    a->server_drain = false;   /* an operator's drain on the old server stays there */
    a->prefix_reported = false;
    a->live_dirty = true;       /* its running_jobs are another list */
    a->live_sent_ms = 0;        /* ... which the new server's first long-poll carries */
    a->delivery_seen[0] = '\0'; /* the old server's delivery numbers */
}

/* Back off after a failed request; returns the delay (ms). With several
 * servers a failure moves to the next one at once while some server of
 * the list is untried in this turn; a whole turn failing backs off as one
 * server does, so that a dead fleet is not hammered. */
uint32_t ag_server_unreachable(agent *a, const char *what, const char *detail)
{
    bool full_turn = ++a->turn_fails % a->n_servers == 0;
    uint32_t d = full_turn ? agent_backoff_next(&a->backoff, ag_rnd32()) : 0;
    if (a->n_servers > 1)
        server_switch(a, what, detail, a->turn_fails > a->n_servers);
    if (!a->server_down_logged && full_turn)
        gp_log_warn("server_unreachable", "%s failed (%s); retrying with backoff", what, detail);
    else
        gp_log_debug("server_unreachable", "%s failed (%s); next try in %u ms", what, detail, d);
    a->server_down_logged = full_turn || a->server_down_logged;
    a->registered = false;
    uint64_t now = gp_now_mono_ms();
    if (!a->poll_req && a->next_poll_ms < now + d)
        a->next_poll_ms = now + d;
    a->next_work_ms = now + d;
    return d;
}

/* The error message of a native error body, for logs. */
const char *ag_error_text(json_t *body)
{
    const char *m = json_string_value(json_object_get(json_object_get(body, "error"), "message"));
    return m ? m : "";
}

/* The stable code of a native error body ("" when none). */
const char *ag_error_code(json_t *body)
{
    const char *c = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
    return c ? c : "";
}

/* How long 401s from every server of a list may last before the key counts
 * as revoked: several refresh intervals of servers sharing a database. */
#define AGENT_AUTH_GRACE_MS 30000

/* The server refused our key (401): revoked, expired or unknown. Retrying
 * cannot help (with several servers: once the grace above is over), so
 * leave with a clear line rather than spin. Exit 2, like a
 * configuration error: the unit's RestartPreventExitStatus=2 keeps systemd
 * from restarting us into the same refusal every few seconds. */
void ag_auth_lost(agent *a, const char *what, long status, json_t *body)
{
    if (a->fatal)
        return;
    if (a->n_servers > 1) {
        /* Servers sharing a database learn of a key made on another one
         * within their refresh interval (shared_refresh_sec, docs/
         * scaling.md): a server we just moved to may not know our key yet.
         * Go on along the list for a while; a key every server still
         * refuses after that is revoked. */
        uint64_t now = gp_now_mono_ms();
        if (!a->auth_refused_since)
            a->auth_refused_since = now;
        if (now - a->auth_refused_since < AGENT_AUTH_GRACE_MS) {
            char d[200];
            snprintf(d, sizeof d, "HTTP %ld %s", status, ag_error_code(body));
            ag_server_unreachable(a, what, d);
            return;
        }
    }
    if (!a->key_from_file && !(a->o->token && *a->o->token)) {
        /* Started without a key against a server with auth off; a key
         * made since then turned auth on. */
        gp_log_error("auth_required",
                     "server refused this agent on %s: HTTP %ld %s %s; exiting. The server "
                     "now requires a key (auth turns on with its first key): make an "
                     "enrollment token (gpupoolctl tokens create) and start this agent with "
                     "--token TOKEN (or GPUPOOL_TOKEN in its environment file)",
                     what, status, ag_error_code(body), ag_error_text(body));
        a->fatal = true;
        a->exit_code = 2;
        return;
    }
    gp_log_error("auth_revoked",
                 "server refused the agent key on %s: HTTP %ld %s %s; exiting. %s%s%s", what,
                 status, ag_error_code(body), ag_error_text(body),
                 a->key_from_file ? "The key in " : "Check --token",
                 a->key_from_file ? a->o->state_dir : "",
                 a->key_from_file ? "/" AGENT_KEY_FILE " is no longer valid: delete it and "
                                    "start with --token NEW_ENROLLMENT_TOKEN to enroll again"
                                  : "");
    a->fatal = true;
    a->exit_code = 2;
}

/* ======================================================================== */
/* /agents/enroll                                                           */
/* ======================================================================== */

/* Use key as our Bearer credential from now on (NULL/"" = none), and
 * build the header list every request shares with it (issue 24: a list
 * per request, and libcurl formats every header byte of each request):
 * the JSON type the server requires of bodies; no "Expect: 100-continue"
 * round trip; no "Accept: *" line the server ignores. 0 or -1. */
int ag_set_key(agent *a, const char *key)
{
    free(a->auth_header);
    a->auth_header = NULL;
    if (key && *key) {
        size_t n = strlen(key) + 32;
        a->auth_header = malloc(n);
        if (!a->auth_header)
            return -1;
        snprintf(a->auth_header, n, "Authorization: Bearer %s", key);
    }
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h2 = h ? curl_slist_append(h, "Expect:") : NULL;
    struct curl_slist *h3 = h2 ? curl_slist_append(h2, "Accept:") : NULL;
    struct curl_slist *h4 = h3 && a->auth_header ? curl_slist_append(h3, a->auth_header) : h3;
    struct curl_slist **old =
        h4 && a->hdrs ? realloc(a->hdrs_old, (a->n_hdrs_old + 1) * sizeof *old) : NULL;
    if (!h4 || (a->hdrs && !old)) {
        curl_slist_free_all(h);
        return -1;
    }
    if (a->hdrs) {
        /* An idle handle may still point at it: kept until agent_destroy
         * (a key changes once, at enrollment). */
        a->hdrs_old = old;
        a->hdrs_old[a->n_hdrs_old++] = a->hdrs;
    }
    a->hdrs = h;
    return 0;
}

void ag_enroll_start(agent *a)
{
    json_t *body = json_pack("{s:s,s:s}", "agent_id", a->id, "name", a->name);
    a->enroll_req = body ? ag_req_start(a, REQ_ENROLL, "/agents/enroll", body,
                                     (long)a->o->request_timeout_sec * 1000, NULL)
                         : NULL;
    if (!a->enroll_req)
        a->next_enroll_ms = gp_now_mono_ms() + 1000;
}

/* The first start with --token and no agent.key: trade the enrollment
 * token for our own key (docs/agent.md). */
void ag_enroll_done(agent *a, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    const char *code = ag_error_code(body);
    if (rc != CURLE_OK || status >= 500 || status == 0 || status == 408 || status == 429) {
        char d[160];
        snprintf(d, sizeof d, "%s, HTTP %ld", rc != CURLE_OK ? curl_easy_strerror(rc) : "ok",
                 status);
        a->next_enroll_ms = now + ag_server_unreachable(a, "enroll", d);
        return;
    }
    if (status == 200) {
        const char *key = json_string_value(json_object_get(body, "agent_key"));
        const char *kid = json_string_value(json_object_get(body, "key_id"));
        char err[512];
        if (!agent_key_valid(key) || agent_state_save_key(a->o->state_dir, key, err,
                                                          sizeof err) < 0) {
            /* The token's use is spent; say so rather than enroll again. */
            gp_log_error("enroll_failed", "enrolled, but could not keep the agent key: %s; "
                         "the enrollment token's use is spent, ask for a new one",
                         agent_key_valid(key) ? err : "the reply holds no valid agent_key");
            a->fatal = true;
            a->exit_code = 1;
            return;
        }
        if (ag_set_key(a, key) < 0) {
            gp_log_error("enroll_failed", "out of memory");
            a->fatal = true;
            a->exit_code = 1;
            return;
        }
        gp_log_info("enrolled", "enrolled with %s as agent %s (key %s); the key is kept in "
                    "%s/" AGENT_KEY_FILE " and used from now on",
                    a->base, a->id, kid ? kid : "?", a->o->state_dir);
        a->key_from_file = true;
    } else if ((status == 403 && strcmp(code, "WRONG_ROLE") == 0) || status == 404 ||
               (status == 409 && strcmp(code, "ENROLLMENT_NOT_NEEDED") == 0)) {
        /* --token AGENTKEY (the key itself), a server without enrollment,
         * or one with auth off: go on with the token as it is. */
        gp_log_info("enroll_skipped", "%s; using --token as the agent key",
                    status == 403   ? "the token is not an enrollment token"
                    : status == 404 ? "the server has no enrollment endpoint"
                                    : "the server runs with auth off");
    } else {
        gp_log_error("enroll_rejected",
                     "server refused enrollment: HTTP %ld %s %s; exiting (ask the operator "
                     "for a new enrollment token)",
                     status, code, ag_error_text(body));
        a->fatal = true;
        a->exit_code = 2;
        return;
    }
    a->enrolling = false;
    a->server_down_logged = false;
    a->turn_fails = 0;
    agent_backoff_reset(&a->backoff);
    a->next_poll_ms = now;
}

void ag_poll_done(agent *a, CURLcode rc, long status, json_t *body)
{
    uint64_t now = gp_now_mono_ms();
    if (rc != CURLE_OK || status >= 500 || status == 0) {
        char d[160];
        snprintf(d, sizeof d, "%s, HTTP %ld", rc != CURLE_OK ? curl_easy_strerror(rc) : "ok",
                 status);
        ag_server_unreachable(a, "poll", d);
        return;
    }
    if (status == 401) {
        ag_auth_lost(a, "/agents/poll", status, body);
        return;
    }
    const char *code = ag_error_code(body);
    if (status == 403 && (strcmp(code, "AGENT_ID_TAKEN") == 0 ||
                          strcmp(code, "KEY_BOUND_TO_OTHER_AGENT") == 0)) {
        /* Our agent_id and our key belong to different agents: no retry can
         * fix that, and the unit must not restart into it (exit 2). */
        gp_log_error("agent_id_refused",
                     "server refused agent_id %s: HTTP 403 %s %s; exiting. The agent_id in "
                     "%s/agent_id and the agent key must belong together: a new box needs "
                     "its own state dir (a new agent_id) and its own key or enrollment token",
                     a->id, code, ag_error_text(body), a->o->state_dir);
        a->fatal = true;
        a->exit_code = 2;
        return;
    }
    if (status != 200) {
        /* 400/403: a configuration problem; log it loudly and retry slowly. */
        gp_log_error("poll_rejected", "server rejected /agents/poll: HTTP %ld %s%s", status,
                     ag_error_text(body), status == 403 ? " (check --token)" : "");
        a->registered = false;
        uint32_t d = agent_backoff_next(&a->backoff, ag_rnd32());
        a->next_poll_ms = now + d;
        a->next_work_ms = now + d;
        return;
    }
    if (a->server_down_logged || !a->registered)
        gp_log_write(GP_LOG_INFO, "registered", NULL, json_pack("{s:s}", "server", a->base),
                     "poll accepted by %s (agent_id %s)", a->base, a->id);
    a->server_down_logged = false;
    a->registered = true;
    a->turn_fails = 0;
    a->auth_refused_since = 0;
    agent_backoff_reset(&a->backoff);
    json_int_t pi = json_integer_value(json_object_get(body, "poll_interval_sec"));
    if (pi >= 1 && pi <= 3600)
        a->poll_interval_ms = (uint32_t)pi * 1000;
    /* A server that takes batched uploads says so; an older one does not,
     * and keeps getting one upload per job. */
    bool batch = false;
    size_t fi;
    json_t *fv;
    json_array_foreach(json_object_get(body, "features"), fi, fv)
    {
        if (json_is_string(fv) && strcmp(json_string_value(fv), "events_batch") == 0)
            batch = true;
    }
    a->events_batch = batch && a->o->events_batch;
    json_int_t ww = json_integer_value(json_object_get(body, "work_wait_sec"));
    if (ww >= 1 && ww <= 3600)
        a->work_wait_ms = (uint32_t)ww * 1000;
    /* Heartbeat a little before the interval runs out (suspect after one miss). */
    a->next_poll_ms = now + a->poll_interval_ms * 3 / 4;
    if (a->draining)
        a->drain_announced = true;
    if (a->next_work_ms > now && !a->work_req)
        a->next_work_ms = now; /* re-park at once now that the server knows us */

    /* The server's deployments for us (only a deploy backend takes them;
     * an older server sends none and nothing changes). */
    const json_t *deps = json_object_get(body, "deployments");
    if (json_is_array(deps) && a->be->ops->deploy)
        a->be->ops->deploy(a->be, deps);

    json_t *cmds = json_object_get(body, "commands");
    size_t i;
    json_t *c;
    bool told_drain = false;
    json_array_foreach(cmds, i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        if (!type)
            continue;
        if (strcmp(type, "cancel") == 0) {
            const char *jid = json_string_value(json_object_get(c, "job_id"));
            agent_job *j = jid ? ag_job_find(a, jid) : NULL;
            if (j) {
                gp_log_info("job_cancel", "server cancelled job %s (poll command)", j->id);
                j->cancelled = true;
                ag_job_cancel(a, j);
                pthread_mutex_lock(&a->mu);
                ag_job_link_locked(a, j); /* nothing more to upload; maybe done */
                pthread_mutex_unlock(&a->mu);
            }
        } else if (strcmp(type, "drain") == 0) {
            /* An operator's drain lasts as long as the server repeats it in
             * every poll reply; it is not ours to announce back (reporting
             * "draining" would keep the agent drained after an undrain). */
            if (!a->server_drain)
                gp_log_info("drain", "server asked this agent to drain");
            told_drain = true;
        } else {
            gp_log_debug("poll_command_ignored", "unknown poll command '%s'", type);
        }
    }
    if (a->server_drain && !told_drain)
        gp_log_info("undrain", "server no longer asks this agent to drain");
    a->server_drain = told_drain;
}
