/* poolmeta: x_pool_meta and the x-pool-* headers (see poolmeta.h). */
#include "server/dialects/poolmeta.h"

#include <stdio.h>

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
    const char *requested = gps_job_requested_model(job);
    if (requested) {
        char w[600];
        snprintf(w, sizeof w, "model '%.256s' had no capacity; served by fallback model '%.256s'",
                 requested, gps_job_model(job));
        json_array_append_new(json_object_get(meta, "warnings"), json_string(w));
    }
    if (gps_job_model_digest(job)[0])
        json_object_set_new(meta, "model_sha256", json_string(gps_job_model_digest(job)));
    /* Routed to the slot that held this many of the prompt's units (a
     * message each, or 1024-byte blocks): the agent skipped their prefill. */
    if (gps_job_prefix_units(job) > 0)
        json_object_set_new(meta, "prefix_units", json_integer(gps_job_prefix_units(job)));
    /* The agent's upstream is another pool: how that pool ran it (its own
     * agent, attempts, failovers), nested as the client would see it there. */
    if (gps_job_upstream_meta(job))
        json_object_set(meta, "upstream", gps_job_upstream_meta(job));
    if (gps_job_continuation_mode(job)) /* "tokens" | "text" after a failover */
        json_object_set_new(meta, "continuation", json_string(gps_job_continuation_mode(job)));
    return meta;
}
