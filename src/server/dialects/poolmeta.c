/* poolmeta: x_pool_meta and the x-pool-* headers (see poolmeta.h). */
#include "server/dialects/poolmeta.h"

#include <stdio.h>
#include <string.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_util.h"

void gps_pool_headers(struct evhttp_request *req, gps_job *job)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    if (gps_job_agent_id(job)[0])
        evhttp_add_header(h, "x-pool-agent", gps_job_agent_id(job));
    char q[32];
    snprintf(q, sizeof q, "%lld", gps_job_queue_ms(job));
    evhttp_add_header(h, "x-pool-queue-ms", q);
    snprintf(q, sizeof q, "%d", gps_job_attempts(job));
    evhttp_add_header(h, "x-pool-attempts", q);
    evhttp_add_header(h, "x-pool-model", gps_job_model(job));
}

/* Whether agent and model can be shown (json_string and json_pack refuse
 * a string that is not UTF-8: no x_pool_meta then). */
static bool utf8(const char *s) { return s && gp_utf8_valid(s, strlen(s)); }

json_t *gps_pool_meta_attach(json_t *o, json_t *meta)
{
    if (o && (!meta || json_object_set_new(o, "x_pool_meta", meta) == 0))
        return o;
    if (!o)
        json_decref(meta);
    json_decref(o); /* (set_new released meta) */
    return NULL;
}

bool gps_pool_meta_shown(gps_job *job)
{
    return utf8(gps_job_agent_id(job)) && utf8(gps_job_model(job));
}

/* o[key] = v, a string; one that is not UTF-8 is left out (as json_string
 * refuses it). -1 only when out of memory. */
static int set_str(json_t *o, const char *key, const char *v)
{
    json_t *j = json_string(v);
    if (!j)
        return utf8(v) ? -1 : 0;
    return json_object_set_new(o, key, j);
}

json_t *gps_pool_meta(gps_job *job)
{
    uint64_t fin = gps_job_finished_us(job), at = gps_job_assigned_us(job);
    uint64_t now = fin ? fin : gp_now_mono_us();
    json_t *meta = json_pack(
        "{s:s,s:s,s:I,s:I,s:i,s:[]}", "agent_id", gps_job_agent_id(job), "model",
        gps_job_model(job), "queue_ms", (json_int_t)gps_job_queue_ms(job), "inference_ms",
        (json_int_t)(at ? (now - at) / 1000 : 0), "attempts", gps_job_attempts(job), "warnings");
    if (!meta)
        return NULL;
    /* Each part set or the whole object refused: a meta without the
     * fallback's warning would hide that another model answered. */
    const char *requested = gps_job_requested_model(job);
    if (requested) {
        char w[600];
        snprintf(w, sizeof w, "model '%.256s' had no capacity; served by fallback model '%.256s'",
                 requested, gps_job_model(job));
        json_t *ws = json_string(w);
        if (ws ? json_array_append_new(json_object_get(meta, "warnings"), ws) < 0 : utf8(w))
            goto oom;
    }
    if (gps_job_model_digest(job)[0] &&
        set_str(meta, "model_sha256", gps_job_model_digest(job)) < 0)
        goto oom;
    /* Routed to the slot that held this many of the prompt's units (a
     * message each, or 1024-byte blocks): the agent skipped their prefill. */
    if (gps_job_prefix_units(job) > 0 &&
        json_object_set_new(meta, "prefix_units", json_integer(gps_job_prefix_units(job))) < 0)
        goto oom;
    /* The agent's upstream is another pool: how that pool ran it (its own
     * agent, attempts, failovers), nested as the client would see it there. */
    if (gps_job_upstream_meta(job) &&
        json_object_set(meta, "upstream", gps_job_upstream_meta(job)) < 0)
        goto oom;
    /* "tokens" | "text" after a failover */
    if (gps_job_continuation_mode(job) &&
        set_str(meta, "continuation", gps_job_continuation_mode(job)) < 0)
        goto oom;
    return meta;
oom:
    json_decref(meta);
    return NULL;
}

/* A string member ",\"name\":\"value\"" (name a literal). */
static int str_member(gp_buf *out, const char *name, const char *value)
{
    return gp_buf_append(out, ",\"", 2) < 0 || gp_buf_append(out, name, strlen(name)) < 0 ||
                   gp_buf_append(out, "\":", 2) < 0 || gp_json_str_append(out, value) < 0
               ? -1
               : 0;
}

static int int_member(gp_buf *out, const char *name, long long value)
{
    return gp_buf_append(out, ",\"", 2) < 0 || gp_buf_append(out, name, strlen(name)) < 0 ||
                   gp_buf_append(out, "\":", 2) < 0 || gp_buf_append_int(out, value) < 0
               ? -1
               : 0;
}

/* Is extra[i] already in the list: the fallback's warning fb (NULL: none)
 * or an earlier extra that was written? */
static bool listed(const char *const *extra, size_t i, const char *fb)
{
    if (fb && strcmp(fb, extra[i]) == 0)
        return true;
    for (size_t k = 0; k < i; k++)
        if (utf8(extra[k]) && strcmp(extra[k], extra[i]) == 0)
            return true;
    return false;
}

/* The warnings list: what gps_pool_meta puts there (a fallback's), then
 * extra, once each. A string json_string refuses (not UTF-8) is left out,
 * as there. */
static int warnings_append(gp_buf *out, gps_job *job, const char *const *extra, size_t n_extra)
{
    bool first = true;
    char w[600];
    const char *fb = NULL;
    if (gp_buf_append(out, ",\"warnings\":[", 13) < 0)
        return -1;
    const char *requested = gps_job_requested_model(job);
    if (requested) {
        snprintf(w, sizeof w, "model '%.256s' had no capacity; served by fallback model '%.256s'",
                 requested, gps_job_model(job));
        if (utf8(w)) {
            if (gp_json_str_append(out, w) < 0)
                return -1;
            first = false;
            fb = w;
        }
    }
    for (size_t i = 0; i < n_extra; i++) {
        if (!utf8(extra[i]) || listed(extra, i, fb))
            continue;
        if ((!first && gp_buf_append(out, ",", 1) < 0) || gp_json_str_append(out, extra[i]) < 0)
            return -1;
        first = false;
    }
    return gp_buf_append(out, "]", 1);
}

int gps_pool_meta_append(gp_buf *out, gps_job *job, const char *const *extra, size_t n_extra)
{
    const char *agent = gps_job_agent_id(job), *model = gps_job_model(job);
    if (!utf8(agent) || !utf8(model))
        return 1;
    size_t at = out->len;
    uint64_t fin = gps_job_finished_us(job), asg = gps_job_assigned_us(job);
    uint64_t now = fin ? fin : gp_now_mono_us();
    const char *digest = gps_job_model_digest(job);
    const char *cont = gps_job_continuation_mode(job);
    const json_t *up = gps_job_upstream_meta(job);
    bool ok = gp_buf_append(out, "{\"agent_id\":", 12) == 0 &&
              gp_json_str_append(out, agent) == 0 && str_member(out, "model", model) == 0 &&
              int_member(out, "queue_ms", gps_job_queue_ms(job)) == 0 &&
              int_member(out, "inference_ms", asg ? (long long)((now - asg) / 1000) : 0) == 0 &&
              int_member(out, "attempts", gps_job_attempts(job)) == 0 &&
              warnings_append(out, job, extra, n_extra) == 0 &&
              (!digest[0] || !utf8(digest) || str_member(out, "model_sha256", digest) == 0) &&
              (gps_job_prefix_units(job) <= 0 ||
               int_member(out, "prefix_units", gps_job_prefix_units(job)) == 0) &&
              (!up || (gp_buf_append(out, ",\"upstream\":", 12) == 0 &&
                       gp_json_dump_append(out, up) == 0)) &&
              (!cont || !utf8(cont) || str_member(out, "continuation", cont) == 0) &&
              gp_buf_append(out, "}", 1) == 0;
    if (ok)
        return 0;
    gp_buf_truncate(out, at);
    return -1;
}
